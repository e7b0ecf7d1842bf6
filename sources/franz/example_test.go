package franz_test

import (
	"context"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/franz"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

type Payment struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// A billing worker reads payments from a topic with franz-go; the producer
// retried the send of p-2, so it is in the log twice. Each payment is
// booked once. kgo options (TLS, SASL, timeouts, balancers) go in
// Config.Opts.
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
	producer, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	send := func(id, body string) *kgo.Record {
		return &kgo.Record{Value: []byte(body), Headers: []kgo.RecordHeader{{Key: "idempotency-key", Value: []byte(id)}}}
	}
	if err := producer.ProduceSync(ctx,
		send("p-1", `{"account": "alice", "amount": 100}`),
		send("p-2", `{"account": "bob", "amount": 250}`),
		send("p-2", `{"account": "bob", "amount": 250}`),
		send("p-3", `{"account": "carol", "amount": 75}`),
	).FirstErr(); err != nil {
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

	src, err := franz.New(pool, franz.Config{
		Brokers: k.Brokers(),
		Group:   kafkatest.Name("billing"),
		Topics:  []string{topic},
		Opts:    []kgo.Opt{kgo.FetchMaxWait(100 * time.Millisecond)},
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
	if err := c.Migrate(ctx); err != nil { // the offsets (sources/kafka's table), markers and parked tables
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

var _ consumer.Hook = hookFunc(nil)
