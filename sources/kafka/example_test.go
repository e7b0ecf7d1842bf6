package kafka_test

import (
	"context"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

type Payment struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// A billing worker reads payments from a topic; the producer retried the
// send of p-2, so it is in the log twice. Each payment is booked once.
func Example() {
	ctx := context.Background()
	k, err := kafkatest.Start() // an in-process Kafka; use your brokers instead
	if err != nil {
		panic(err)
	}
	defer k.Close()
	topic := kafkatest.Name("payments")
	if err := k.CreateTopic(ctx, topic, 2); err != nil {
		panic(err)
	}
	send := func(id, body string) kafkago.Message {
		return kafkago.Message{Value: []byte(body), Headers: []kafkago.Header{{Key: "idempotency-key", Value: []byte(id)}}}
	}
	if err := k.Produce(ctx, topic,
		send("p-1", `{"account": "alice", "amount": 100}`),
		send("p-2", `{"account": "bob", "amount": 250}`),
		send("p-2", `{"account": "bob", "amount": 250}`),
		send("p-3", `{"account": "carol", "amount": 75}`),
	); err != nil {
		panic(err)
	}

	pg, err := pgtest.Start(ctx, pgtest.Options{}) // a throwaway PostgreSQL; use yours instead
	if err != nil {
		panic(err)
	}
	defer pg.Stop()
	pool, err := pgxpool.New(ctx, pg.URL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (id text, account text, amount bigint)`); err != nil {
		panic(err)
	}

	src, err := kafka.New(pool, kafka.Config{
		Brokers: k.Brokers(),
		Group:   kafkatest.Name("billing"),
		Topics:  []string{topic},
		MaxWait: 100 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	defer src.Close()
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		panic(err)
	}
	settled := make(chan int, 16)
	c, err := consumer.New(pool, src, consumer.Config{
		Name:     "billing",
		Strategy: strategy,
		Handler: consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, p Payment) error {
			_, err := tx.Exec(ctx, `INSERT INTO payments VALUES ($1, $2, $3)`, m.ID, p.Account, p.Amount)
			return err
		}),
		Hooks: []consumer.Hook{hookFunc(func(s *consumer.BatchStats) { settled <- s.Applied + s.Duplicate + s.Parked })},
	})
	if err != nil {
		panic(err)
	}
	if err := c.Migrate(ctx); err != nil { // the offsets, markers and parked tables
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- c.Run(runCtx) }()
	for n := 0; n < 4; n += <-settled {
	}
	stop()
	if err := <-done; err != nil {
		panic(err)
	}

	rows, _ := pool.Query(ctx, `SELECT id, account, amount FROM payments ORDER BY id`)
	for rows.Next() {
		var id, account string
		var amount int64
		_ = rows.Scan(&id, &account, &amount)
		fmt.Println(id, account, amount)
	}
	// Output:
	// p-1 alice 100
	// p-2 bob 250
	// p-3 carol 75
}

type hookFunc func(*consumer.BatchStats)

func (f hookFunc) BatchDone(_ context.Context, s *consumer.BatchStats) { f(s) }
