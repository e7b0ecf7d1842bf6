package pg_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// counting wraps a pool and counts its Begin calls, as a tracing wrapper
// would; it keeps the pool's other methods, BeginTx and Acquire among them.
type counting struct {
	*pgxpool.Pool
	begins atomic.Int64
}

func (c *counting) Begin(ctx context.Context) (pgx.Tx, error) {
	c.begins.Add(1)
	return c.Pool.Begin(ctx)
}

// TestWrappedPoolIsNotBypassed: a wrapper that overrides Begin sees every
// transaction the library starts, although it still has the pool's
// BeginTx and Acquire; the capabilities are used on the pool itself only.
func TestWrappedPoolIsNotBypassed(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	w := &counting{Pool: pool}
	if pg.Beginner(w) != nil || pg.Pool(w) != nil {
		t.Fatal("a wrapper's embedded BeginTx or Acquire was taken for the pool's")
	}
	if pg.Beginner(pool) == nil || pg.Pool(pool) == nil {
		t.Fatal("the pool's own capabilities were not found")
	}

	// BeginIn sets the isolation level through the wrapper's Begin.
	tx, err := pg.BeginIn(ctx, w, pgx.RepeatableRead)
	if err != nil {
		t.Fatal(err)
	}
	var iso string
	if err := tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&iso); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if iso != "repeatable read" || w.begins.Load() != 1 {
		t.Fatalf("isolation %q after %d Begin calls; want repeatable read after 1", iso, w.begins.Load())
	}

	// A consumer with an IdleTxTimeout (which begins with BeginTx on a
	// pool) begins every batch through the wrapper.
	if _, err := pool.Exec(ctx, `CREATE TABLE wrapped_effects (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	broker := consumertest.New(consumertest.Config{Lanes: 1})
	for i := range 20 {
		id := "m" + string(rune('a'+i))
		broker.Publish(0, consumer.Message{ID: id, Value: []byte(id)})
	}
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w.begins.Store(0)
	c := consumertest.NewConsumer(t, w, broker, consumer.Config{Name: "wrapped", Strategy: strategy, BatchSize: 5,
		IdleTxTimeout: time.Minute, Logger: consumertest.Logger(),
		Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO wrapped_effects (id) VALUES ($1)`, m.ID)
			return err
		}})
	consumertest.RunUntilIdle(t, c, broker, time.Minute)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM wrapped_effects`).Scan(&n); err != nil || n != 20 {
		t.Fatalf("%d effects (%v), want 20", n, err)
	}
	if b := w.begins.Load(); b < 4 {
		t.Fatalf("the wrapper saw %d Begin calls for at least 4 batches", b)
	}
}
