package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/bench"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestOutboxBenchmarks runs each outbox benchmark small, so that the
// table's command keeps working: each checks its own counts.
func TestOutboxBenchmarks(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	ob, err := bench.SetupOutbox(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bench.EngineEmit(ob)(ctx, pool, 1200, 500); err != nil {
		t.Fatal(err)
	}
	obLog, err := bench.OutboxMode(outbox.LogMode)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []func(context.Context, *pgxpool.Pool, int, int) (time.Duration, error){
		bench.EngineEmit(obLog), bench.EngineQueueEmit(obLog), bench.EngineQueueEmit(ob),
	} {
		if err := bench.ResetOutbox(ctx, pool); err != nil {
			t.Fatal(err)
		}
		if _, err := e(ctx, pool, 1200, 500); err != nil {
			t.Fatal(err)
		}
	}
	k := kafkatest.New(t)
	topic := kafkatest.Name("outbox-bench")
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}
	if err := bench.ResetOutbox(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, retention := range []time.Duration{0, outbox.DeleteOnPublish} {
		if err := bench.ResetOutbox(ctx, pool); err != nil {
			t.Fatal(err)
		}
		if _, err := bench.RelayThroughput(ctx, pool, ob, k, topic, 2000, retention); err != nil {
			t.Fatal(err)
		}
	}
	if err := bench.ResetOutbox(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := bench.LogRelayThroughput(ctx, pool, ob, k, topic, 2000); err != nil {
		t.Fatal(err)
	}
	if _, err := bench.WriterThroughput(ctx, k, topic, 2000); err != nil {
		t.Fatal(err)
	}
	if err := bench.ResetOutbox(ctx, pool); err != nil {
		t.Fatal(err)
	}
	l, err := bench.CommitToPublish(ctx, pool, ob, k, topic, 10, false, false)
	if err != nil {
		t.Fatal(err)
	}
	if l.Samples != 10 || l.P50 <= 0 {
		t.Fatalf("latency %+v, want 10 samples", l)
	}
	if err := bench.ResetOutbox(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if l, err = bench.LogCommitToPublish(ctx, pool, ob, k, topic, 10, true, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if l.Samples != 10 || l.P50 <= 0 {
		t.Fatalf("log relay latency %+v, want 10 samples", l)
	}
}
