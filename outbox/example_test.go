package outbox_test

import (
	"context"
	"fmt"

	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// printSink prints what it publishes; use outbox.NewKafkaSink for Kafka.
type printSink chan string

func (s printSink) Publish(_ context.Context, msgs []outbox.Message) error {
	for _, m := range msgs {
		s <- fmt.Sprintf("%s %s=%s (id %s)", m.Sink, m.Key, m.Value, m.ID)
	}
	return nil
}

// An order and its announcement commit together; a rolled-back order
// announces nothing.
func Example() {
	ctx := context.Background()
	server, err := pgtest.Start(ctx, pgtest.Options{}) // a throwaway PostgreSQL; use yours instead
	if err != nil {
		panic(err)
	}
	defer server.Stop()
	pool, err := pgxpool.New(ctx, server.URL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	ob, err := outbox.New(outbox.Config{Sinks: []string{"orders"}, Mode: outbox.TableMode}) // read by the table-polling Relay below
	if err != nil {
		panic(err)
	}
	if _, err := pg.Migrate(ctx, pool, "", ob.Line()); err != nil {
		panic(err)
	}
	place := func(id, customer string, commit bool) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			panic(err)
		}
		defer tx.Rollback(ctx)
		// … the order's own rows, in tx …
		if err := ob.Emit(ctx, tx, outbox.Message{Sink: "orders", Key: []byte(customer), Value: []byte("placed"), ID: id}); err != nil {
			panic(err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				panic(err)
			}
		}
	}
	place("order-1", "alice", true)
	place("order-2", "bob", false)
	place("order-3", "alice", true)

	out := make(printSink, 10)
	relay, err := outbox.NewRelay(pool, outbox.RelayConfig{Sinks: map[string]outbox.Sink{"orders": out}})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- relay.Run(runCtx) }()
	fmt.Println(<-out)
	fmt.Println(<-out)
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	var left int
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM effectively.outbox WHERE published_at IS NULL`).Scan(&left)
	})
	fmt.Println("unpublished:", left)
	// Output:
	// orders alice=placed (id order-1)
	// orders alice=placed (id order-3)
	// unpublished: 0
}
