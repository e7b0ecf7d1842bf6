package highwater_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

// Claiming by hand, in the transaction that also writes the effect (the
// consumer package does this for you). Sender a's seq 4 arrives before 3
// and is held back as a gap until 3 has applied; sender b's seq 2 never
// comes, so b is stuck until its mark is advanced past the hole.
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

	strategy, err := highwater.New(highwater.Config{}) // strict mode
	if err != nil {
		panic(err)
	}
	if _, err := pg.Migrate(ctx, pool, "", strategy.Migrations()...); err != nil {
		panic(err)
	}

	deliver := func(msgs ...string) {
		keys := make([]dedupe.Key, len(msgs))
		for i, m := range msgs {
			var sender string
			var seq int64
			fmt.Sscanf(m, "%1s%d", &sender, &seq)
			keys[i] = dedupe.Key{Scope: "payments", Sender: sender, Seq: seq}
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
		strategy.Committed(keys, verdicts)
		fmt.Println(msgs, verdicts)
	}
	deliver("a1", "a2", "a2", "b1", "a4")
	deliver("a1", "a3", "a4", "b3")
	for _, s := range strategy.Stuck() {
		fmt.Printf("stuck: %s at mark %d, holding %d\n", s.Sender, s.Mark, s.LowestHeld)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	from, err := strategy.Advance(ctx, tx, "payments", "b", 2, "b2 was lost with the producer's disk")
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(ctx); err != nil {
		panic(err)
	}
	fmt.Printf("advanced b from %d to 2\n", from)
	deliver("b3")
	fmt.Println("stuck senders:", len(strategy.Stuck()))
	// Output:
	// [a1 a2 a2 b1 a4] [new new duplicate new gap]
	// [a1 a3 a4 b3] [duplicate new new gap]
	// stuck: b at mark 1, holding 3
	// advanced b from 1 to 2
	// [b3] [new]
	// stuck senders: 0
}
