package bench_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/bench"
	"github.com/effectively-once/effectively/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// BenchmarkVariants runs every variant with b.N messages and reports
// messages per second. For the side-by-side table, run cmd/benchtable.
func BenchmarkVariants(b *testing.B) {
	pool := pgtest.NewPool(b)
	ctx := context.Background()
	if err := bench.Setup(ctx, pool); err != nil {
		b.Fatal(err)
	}
	for _, v := range bench.Variants() {
		b.Run(fmt.Sprintf("%s/batch=%d", v.Name, v.Batch), func(b *testing.B) {
			if err := bench.Reset(ctx, pool); err != nil {
				b.Fatal(err)
			}
			d, err := v.Run(ctx, pool, b.N, v.Batch)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/d.Seconds(), "msgs/s")
		})
	}
}

// TestVariantsAgree checks that every variant writes one ledger row per
// message, so the benchmark compares equal work.
func TestVariantsAgree(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	if err := bench.Setup(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, v := range bench.Variants() {
		if err := bench.Reset(ctx, pool); err != nil {
			t.Fatal(err)
		}
		if _, err := v.Run(ctx, pool, 700, v.Batch); err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		var ledger, markers int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(DISTINCT msg_id) FROM ledger), (SELECT count(*) FROM effectively.processed)`).Scan(&ledger, &markers); err != nil {
			t.Fatal(err)
		}
		if ledger != 700 || markers != 700 {
			t.Errorf("%s batch %d: %d ledger rows, %d markers; want 700 each", v.Name, v.Batch, ledger, markers)
		}
	}
}

// TestLanesTable runs the lanes table small, so that its command keeps
// working: every run checks its ledger's row count.
func TestLanesTable(t *testing.T) {
	var out, log strings.Builder
	opts := bench.LanesOptions{Lanes: []int{1, 3}, Messages: 1200, Runs: 1, SynchronousCommit: []string{"on", "off"}}
	if err := bench.LanesTable(context.Background(), pgtest.URL(t), opts, &out, &log); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	for _, want := range []string{"| 3 | engine, QueueHandler |", "| 3 | raw: unnest markers + effects |", "| 1 | engine, BatchHandler |"} {
		if strings.Count(out.String(), want) != 3 { // two settings' tables and their comparison
			t.Errorf("table has not three rows %q:\n%s", want, out.String())
		}
	}
}

// engineMessages is how many messages one op of the BenchmarkEngine
// benchmarks processes: B/op and allocs/op divided by it are per message,
// and so are the B/msg and allocs/msg they report.
const engineMessages = 5000

// benchEngine runs the consumer with handler shape s on lanes lanes, batch
// 500, engineMessages messages per op. Publishing them and emptying the
// tables are outside the timer, and outside the allocation counts.
func benchEngine(b *testing.B, s bench.Shape, lanes int) {
	pool := pgtest.NewPool(b)
	ctx := context.Background()
	if err := bench.Setup(ctx, pool); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var bytes, allocs uint64
	var before, after runtime.MemStats
	for range b.N {
		b.StopTimer()
		if err := bench.Reset(ctx, pool); err != nil {
			b.Fatal(err)
		}
		p, err := bench.PrepareEngine(pool, engineMessages, 500, lanes, s)
		if err != nil {
			b.Fatal(err)
		}
		runtime.ReadMemStats(&before)
		b.StartTimer()
		if _, err := p.Run(ctx); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		runtime.ReadMemStats(&after)
		bytes += after.TotalAlloc - before.TotalAlloc
		allocs += after.Mallocs - before.Mallocs
		b.StartTimer()
	}
	msgs := float64(b.N * engineMessages)
	b.ReportMetric(msgs/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64(bytes)/msgs, "B/msg")
	b.ReportMetric(float64(allocs)/msgs, "allocs/msg")
}

func BenchmarkEngineHandler(b *testing.B)      { benchEngine(b, bench.ShapeHandler, 1) }
func BenchmarkEngineQueueHandler(b *testing.B) { benchEngine(b, bench.ShapeQueue, 1) }
func BenchmarkEngineBatchHandler(b *testing.B) { benchEngine(b, bench.ShapeBatch, 1) }

// BenchmarkEngineBatchHandler4 is BenchmarkEngineBatchHandler on four
// lanes at once.
func BenchmarkEngineBatchHandler4(b *testing.B) { benchEngine(b, bench.ShapeBatch, 4) }
