package bloom_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

// Setting the strategy up and claiming batches by hand, in the transaction
// that also writes the effects (the consumer package does this for you).
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

	strategy, err := bloom.New(bloom.Config{}) // hourly partitions, kept 7 days
	if err != nil {
		panic(err)
	}
	if _, err := pg.Migrate(ctx, pool, "", strategy.Migrations()...); err != nil {
		panic(err)
	}
	if err := strategy.Maintain(ctx, pool); err != nil { // the partitions
		panic(err)
	}
	maintCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = strategy.RunMaintenance(maintCtx, pool) }() // partitions ahead, drops, seals
	if err := strategy.Warm(ctx, pool); err != nil {            // filters from the live partitions
		panic(err)
	}

	deliver := func(ids ...string) {
		keys := make([]dedupe.Key, len(ids))
		for i, id := range ids {
			keys[i] = dedupe.Key{Scope: "payments", ID: id}
		}
		var verdicts []dedupe.Verdict
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			verdicts, err = strategy.Claim(ctx, tx, keys)
			// ... apply the new messages' effects with tx here ...
			return err
		})
		if err != nil {
			panic(err)
		}
		strategy.Committed(keys, verdicts)
		fmt.Println(verdicts)
	}
	deliver("p-1", "p-2")
	deliver("p-2", "p-3", "p-3")
	// Output:
	// [new new]
	// [duplicate new duplicate]
}
