package consumer_test

import (
	"context"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

type Transfer struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// A ledger worker: the producer sends transfer t-2 twice, and a malformed
// message arrives; the ledger gets each transfer once and the malformed
// message is parked.
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
	if _, err := pool.Exec(ctx, `CREATE TABLE ledger (transfer_id text, account text, amount bigint)`); err != nil {
		panic(err)
	}

	source := consumertest.New(consumertest.Config{Lanes: 1})
	for _, body := range []string{
		`{"id": "t-1", "account": "alice", "amount": 100}`,
		`{"id": "t-2", "account": "bob", "amount": -40}`,
		`{"id": "t-2", "account": "bob", "amount": -40}`,
		`{"id": "t-3", "account": "alice", "amount": "lots"}`,
	} {
		source.Publish(0, consumer.Message{Value: []byte(body)})
	}

	strategy, err := idset.New(idset.Config{Retention: 14 * 24 * time.Hour})
	if err != nil {
		panic(err)
	}
	c, err := consumer.New(pool, source, consumer.Config{
		Name:     "ledger",
		Strategy: strategy,
		KeyFunc:  consumer.JSONField("id"),
		Handler: consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, t Transfer) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger VALUES ($1, $2, $3)`, t.ID, t.Account, t.Amount)
			return err
		}),
	})
	if err != nil {
		panic(err)
	}
	if err := c.Migrate(ctx); err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	go func() {
		_ = source.WaitIdle(ctx)
		stop()
	}()
	if err := c.Run(runCtx); err != nil {
		panic(err)
	}

	var rows, total int64
	_ = pool.QueryRow(ctx, `SELECT count(*), sum(amount) FROM ledger`).Scan(&rows, &total)
	var reason string
	_ = pool.QueryRow(ctx, `SELECT reason FROM effectively.parked`).Scan(&reason)
	fmt.Printf("ledger: %d rows, total %d\n", rows, total)
	fmt.Println("parked:", reason)
	// Output:
	// ledger: 2 rows, total 60
	// parked: permanent
}
