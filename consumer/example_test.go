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

// A QueueHandler reads before it writes, at batch speed: each transfer
// reads its account's balance and, from the callback, queues the debit and
// the ledger row. The handler is called once per message, and the
// statements of the whole batch go to PostgreSQL in two round trips (the
// reads, then the writes). An overdraft is parked; its batch-mates commit.
func ExampleQueueHandler() {
	ctx := context.Background()
	cluster, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		panic(err)
	}
	defer cluster.Stop()
	pool, err := pgxpool.New(ctx, cluster.URL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL);
		CREATE TABLE ledger (transfer_id text, account text, amount bigint);
		INSERT INTO accounts VALUES ('alice', 100), ('bob', 10)`); err != nil {
		panic(err)
	}

	source := consumertest.New(consumertest.Config{Lanes: 1})
	for _, body := range []string{
		`{"id": "t-1", "account": "alice", "amount": 30}`,
		`{"id": "t-2", "account": "bob", "amount": 50}`,
		`{"id": "t-3", "account": "alice", "amount": 20}`,
		`{"id": "t-1", "account": "alice", "amount": 30}`,
	} {
		source.Publish(0, consumer.Message{Value: []byte(body)})
	}

	strategy, err := idset.New(idset.Config{Retention: 14 * 24 * time.Hour})
	if err != nil {
		panic(err)
	}
	c, err := consumer.New(pool, source, consumer.Config{
		Name:     "debits",
		Strategy: strategy,
		KeyFunc:  consumer.JSONField("id"),
		QueueHandler: consumer.JSONQueue(func(ctx context.Context, q consumer.Queue, m *consumer.Message, t Transfer) error {
			q.Queue(`SELECT balance FROM accounts WHERE id = $1 FOR UPDATE`, t.Account).QueryRow(func(row pgx.Row) error {
				var balance int64
				if err := row.Scan(&balance); err != nil {
					return err
				}
				if balance < t.Amount {
					return consumer.Permanent(fmt.Errorf("%s has %d, cannot pay %d", t.Account, balance, t.Amount))
				}
				q.Queue(`UPDATE accounts SET balance = balance - $2 WHERE id = $1`, t.Account, t.Amount)
				q.Queue(`INSERT INTO ledger VALUES ($1, $2, $3)`, t.ID, t.Account, -t.Amount)
				return nil
			})
			return nil
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

	var alice, bob, rows int64
	_ = pool.QueryRow(ctx, `SELECT (SELECT balance FROM accounts WHERE id = 'alice'), (SELECT balance FROM accounts WHERE id = 'bob'), (SELECT count(*) FROM ledger)`).Scan(&alice, &bob, &rows)
	var reason, lastErr string
	_ = pool.QueryRow(ctx, `SELECT reason, last_error FROM effectively.parked`).Scan(&reason, &lastErr)
	fmt.Printf("alice %d, bob %d, ledger rows %d\n", alice, bob, rows)
	fmt.Println("parked:", reason, "-", lastErr)
	// Output:
	// alice 50, bob 10, ledger rows 2
	// parked: permanent - queued statement "SELECT balance FROM accounts WHERE id = $1 FOR UPDATE": permanent: bob has 10, cannot pay 50
}
