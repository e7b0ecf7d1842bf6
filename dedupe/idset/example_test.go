package idset_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

// Claiming a batch by hand, in the transaction that also writes the effect
// (the consumer package does this for you). The second delivery of o-2 and
// the reuse of o-1 for another payload are recognised.
func Example() {
	ctx := context.Background()
	cluster, err := pgtest.Start(ctx, pgtest.Options{}) // or your own database
	if err != nil {
		panic(err)
	}
	defer cluster.Stop()
	pool, err := pgxpool.New(ctx, cluster.URL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	strategy, err := idset.New(idset.Config{Retention: 14 * 24 * time.Hour})
	if err != nil {
		panic(err)
	}
	if _, err := pg.Migrate(ctx, pool, "", strategy.Migrations()...); err != nil {
		panic(err)
	}
	sweepCtx, stopSweeper := context.WithCancel(ctx)
	defer stopSweeper()
	go func() { _ = strategy.RunSweeper(sweepCtx, pool) }()

	deliver := func(ids, payloads []string) {
		keys := make([]dedupe.Key, len(ids))
		for i := range ids {
			keys[i] = dedupe.Key{Scope: "orders", ID: ids[i], Fingerprint: dedupe.Fingerprint([]byte(payloads[i]))}
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			panic(err)
		}
		defer tx.Rollback(ctx)
		verdicts, err := strategy.Claim(ctx, tx, keys)
		if err != nil {
			panic(err)
		}
		// ... apply the new messages' effects with tx here ...
		if err := tx.Commit(ctx); err != nil {
			panic(err)
		}
		fmt.Println(verdicts)
	}
	deliver([]string{"o-1", "o-2"}, []string{"pizza", "pasta"})
	deliver([]string{"o-2", "o-3", "o-1"}, []string{"pasta", "salad", "soup"})
	// Output:
	// [new new]
	// [duplicate new mismatch]
}
