package franz

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestEngineCommitLostThenStopped: a batch's COMMIT loses its reply after
// the server committed it (and with it the partition's offset in
// PostgreSQL), and the consumer is stopped at once, as a worker that dies
// right after would be. Another consumer takes the partitions over from the
// offsets in PostgreSQL, so the batch is not delivered again. The first
// consumer must have found out that the batch committed and reported its
// messages applied: every message reported applied exactly once, none
// unknown, each with one effect.
func TestEngineCommitLostThenStopped(t *testing.T) {
	e := newEnv(t, 2)
	const n = 2000
	e.produce(0, n)
	loss := &pgtest.CommitLoss{}
	lossy := loss.Pool(t, e.pool.Config().ConnString())
	h := &consumertest.Counter{}
	var armed atomic.Bool
	handler := func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		if armed.CompareAndSwap(false, true) {
			loss.Arm()
		}
		return insertEffects(ctx, tx, msgs)
	}
	engine := func(src consumer.Source) *consumer.Consumer {
		strategy, err := idset.New(idset.Config{})
		if err != nil {
			t.Fatal(err)
		}
		return consumertest.NewConsumer(t, lossy, src, consumer.Config{
			Name:         "ledger",
			Strategy:     strategy,
			BatchHandler: handler,
			BatchSize:    250,
			Hooks:        []consumer.Hook{h},
			Logger:       testLogger(),
		})
	}
	firstSrc := e.source()
	first := consumertest.Start(engine(firstSrc))
	waitFor(t, 30*time.Second, "a lost COMMIT reply", func() bool { return loss.Dropped() == 1 })
	first.Stop(t)
	_ = firstSrc.Close()

	second := consumertest.Start(engine(e.source()))
	e.waitEffects(n, 30*time.Second)
	waitFor(t, 30*time.Second, "every message reported", func() bool {
		tot := h.Total()
		return tot.Applied+tot.Duplicate >= n
	})
	second.Stop(t)

	if rows, distinct := e.effects(); rows != n || distinct != n {
		t.Fatalf("%d effect rows for %d distinct messages, want %d of each", rows, distinct, n)
	}
	tot := h.Total()
	unknown, lost := 0, 0
	for _, b := range h.Batches() {
		unknown += b.Unknown
		if b.CommitLost {
			lost++
		}
	}
	if unknown != 0 || tot.Applied != n || lost != 1 {
		t.Errorf("reported %d applied, %d unknown, %d batches with a lost COMMIT resolved; want %d applied, 0 unknown, 1 resolved (%s)",
			tot.Applied, unknown, lost, n, h)
	}
}
