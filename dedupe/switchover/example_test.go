package switchover_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/dedupe/switchover"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

// A consumer moving from idset to bloom: the message o-1, processed on
// idset before the switch, is still a duplicate through the Migration,
// which bloom alone would have applied again. Give the consumer
// m.Strategy() (consumer.Config.Strategy); its Migrate creates both
// strategies' tables and its Run their maintenance.
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

	old, _ := idset.New(idset.Config{})
	nw, _ := bloom.New(bloom.Config{Slice: time.Minute, Retention: time.Hour})
	claim := func(s dedupe.Strategy, ids ...string) []dedupe.Verdict {
		keys := make([]dedupe.Key, len(ids))
		for i, id := range ids {
			keys[i] = dedupe.Key{Scope: "orders", ID: id}
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			panic(err)
		}
		defer tx.Rollback(ctx)
		vs, err := s.Claim(ctx, tx, keys)
		if err != nil {
			panic(err)
		}
		if err := tx.Commit(ctx); err != nil {
			panic(err)
		}
		return vs
	}

	// Before the switch.
	if _, err := pg.Migrate(ctx, pool, "", old.Migrations()...); err != nil {
		panic(err)
	}
	fmt.Println("idset:", claim(old, "o-1"))

	// The switch, deployed at since: idset's store is consulted for a week
	// (its retention), then it can be dropped.
	since := time.Now()
	m, err := switchover.New(switchover.Config{Old: old, New: nw, Since: since})
	if err != nil {
		panic(err)
	}
	s := m.Strategy()
	if _, err := pg.Migrate(ctx, pool, "", s.(dedupe.Migrator).Migrations()...); err != nil {
		panic(err)
	}
	if err := s.(dedupe.Maintainer).Maintain(ctx, pool); err != nil { // bloom's partitions
		panic(err)
	}
	fmt.Println("migration:", claim(s, "o-1", "o-2"))
	fmt.Println("migration:", claim(s, "o-2"))
	st := m.Status()
	fmt.Println("consulting idset until", st.Until.Sub(since), "; droppable now:", st.Droppable())
	// Output:
	// idset: [new]
	// migration: [duplicate new]
	// migration: [duplicate]
	// consulting idset until 168h0m0s ; droppable now: false
}
