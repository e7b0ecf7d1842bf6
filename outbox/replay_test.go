package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/jackc/pgx/v5"
)

// TestReplayThroughPipeline: what docs/replay.md's workflows do to the next
// stage. Applying an input again in the same scope (a same-scope replay of
// a message whose marker is gone, or that was skipped) emits the same IDs,
// so the next stage drops them as duplicates; recomputing into a new scope
// emits new IDs, so the next stage applies them again.
func TestReplayThroughPipeline(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	in := consumer.Message{ID: "order-1", Key: []byte("acct"), Value: []byte("order-1")}

	// stageA applies in once with scope, its markers in table.
	stageA := func(name, scope, table string) {
		strategy, err := idset.New(idset.Config{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		b := consumertest.New(consumertest.Config{Lanes: 1})
		b.Publish(0, in)
		c := consumertest.NewConsumer(t, db, b, consumer.Config{Name: name, Scope: scope, Strategy: strategy,
			Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				return o.EmitFor(ctx, tx, m, Message{Sink: "s", Key: m.Key, Value: m.Value})
			}})
		consumertest.RunUntilIdle(t, c, b, 2*time.Minute)
	}
	stageA("a", "ledger", "markers_a")
	stageA("a-replay", "ledger", "markers_a_replay") // same scope, markers gone
	stageA("a-recompute", "ledger-v2", "markers_a_v2")

	sink := newMemSink()
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}})
	got := sink.waitFor(t, 2*time.Minute, "3 messages", func(m []Message) bool { return len(m) >= 3 })
	if got[0].ID != got[1].ID || got[2].ID == got[0].ID {
		t.Fatalf("IDs %v: want the same-scope replay to repeat the first ID and the new scope to make another", ids(got))
	}

	// The next stage, with the default key (the idempotency-key header's
	// value is Message.ID at the sources), applies twice: once for the
	// original, once for the recomputation.
	next := consumertest.New(consumertest.Config{Lanes: 1})
	for _, m := range got {
		next.Publish(0, consumer.Message{ID: m.ID, Key: m.Key, Value: m.Value})
	}
	strategy, err := idset.New(idset.Config{Table: "markers_b"})
	if err != nil {
		t.Fatal(err)
	}
	counter := &consumertest.Counter{}
	c := consumertest.NewConsumer(t, db, next, consumer.Config{Name: "b", Strategy: strategy, Hooks: []consumer.Hook{counter},
		Handler: func(context.Context, pgx.Tx, *consumer.Message) error { return nil }})
	consumertest.RunUntilIdle(t, c, next, 2*time.Minute)
	if tot := counter.Total(); tot.Applied != 2 || tot.Duplicate != 1 {
		t.Fatalf("next stage: %s; want 2 applied, 1 duplicate", tot)
	}
}
