package bench_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/bench"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestKafkaLatency runs the latency benchmark small, so that its command
// keeps working: each handler shape, and the hand-written consumer it is
// measured against, at a low rate, every message due in
// the window timed and committed once (the run checks the ledger), then
// the table the command prints.
func TestKafkaLatency(t *testing.T) {
	url := pgtest.URL(t)
	k := kafkatest.New(t)
	ctx := context.Background()
	opts := bench.LatencyOptions{Duration: time.Second, Warmup: 300 * time.Millisecond, Drain: time.Minute}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 2*bench.LatencyPartitions + 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := bench.Setup(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, s := range []bench.Shape{bench.ShapeBatch, bench.ShapeQueue, bench.ShapeRaw} {
		r, err := bench.KafkaLatency(ctx, pool, k, s, 400, opts)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		if r.Samples != 400 || r.NotCommitted != 0 || r.Other != 0 || r.P50 <= 0 || r.P99 < r.P50 || r.Max < r.P99 {
			t.Errorf("%s: %+v; want 400 samples, all committed and applied, ordered percentiles", s, r)
		}
	}

	piped := opts
	piped.Pipeline = true
	if r, err := bench.KafkaLatency(ctx, pool, k, bench.ShapeBatch, 400, piped); err != nil {
		t.Fatalf("pipelined: %v", err)
	} else if r.Samples != 400 || r.NotCommitted != 0 || r.Other != 0 {
		t.Errorf("pipelined: %+v; want 400 samples, all committed and applied", r)
	}

	var out, log strings.Builder
	opts.Shapes, opts.Rates = []bench.Shape{bench.ShapeQueue}, []float64{300}
	if err := bench.LatencyTable(ctx, url, k, opts, &out, &log); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if !strings.Contains(out.String(), "| QueueHandler | 300 |") {
		t.Errorf("no row for the QueueHandler at 300 msgs/s:\n%s", out.String())
	}
}
