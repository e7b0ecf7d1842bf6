// Command quickstart is a ledger worker that applies each transfer exactly
// once although its producer sends some transfers twice and its workers
// crash mid-batch again and again.
//
//	go run ./examples/quickstart
//
// It runs on an embedded Kafka (franz-go's kfake, in-process, speaking the
// real protocol to kafka-go) unless KAFKA_BROKERS names a cluster, and on a
// throwaway PostgreSQL unless DATABASE_URL names a database. It produces the
// transfers, then consumes them with two workers in one consumer group: one
// runs throughout, the other crashes (its batch in flight is abandoned, its
// Kafka offsets are not committed) and restarts every few hundred milliseconds, which
// also makes the group rebalance. It prints progress, then a report, and
// exits with status 1 if the ledger is not exactly the sum of the valid
// transfers.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"
)

// Transfer is the message payload.
type Transfer struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// apply is the business effect: one ledger row per transfer, written in
// the transaction that also records the transfer as processed and moves the
// partition's offset.
func apply(ctx context.Context, tx pgx.Tx, m *consumer.Message, t Transfer) error {
	if t.Amount == 0 {
		return consumer.Permanent(fmt.Errorf("transfer %s has no amount", t.ID))
	}
	_, err := tx.Exec(ctx, `INSERT INTO ledger (transfer_id, account, amount) VALUES ($1, $2, $3)`, t.ID, t.Account, t.Amount)
	return err
}

func main() {
	n := flag.Int("transfers", 50000, "number of transfers to produce")
	timeout := flag.Duration("timeout", 5*time.Minute, "how long the workers may take to book or park every transfer")
	flag.Parse()
	if err := run(context.Background(), *n, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, n int, timeout time.Duration) error {
	cluster, err := kafkatest.Start() // KAFKA_BROKERS, or an embedded cluster
	if err != nil {
		return err
	}
	defer cluster.Close()
	embedded := cluster.Fake() != nil
	if embedded {
		fmt.Println("started an embedded Kafka (set KAFKA_BROKERS to use yours)")
	}
	pool, closeDB, err := pgtest.EnvPool(ctx, pgtest.Options{}, os.Stdout) // DATABASE_URL, or a throwaway server
	if err != nil {
		return err
	}
	defer closeDB()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS ledger (
    transfer_id text   NOT NULL,
    account     text   NOT NULL,
    amount      bigint NOT NULL
)`); err != nil {
		return err
	}

	// A fresh topic, group and scope per run, so the demo can run again on
	// the same database and cluster.
	run := kafkatest.Name("quickstart")
	topic, want, valid, invalid, produced, err := produce(ctx, cluster, run, n)
	if err != nil {
		return err
	}
	fmt.Printf("produced %d messages to %s: %d transfers (every 40th sent twice, as a retrying producer does) and %d invalid ones\n",
		produced, topic, valid+invalid, invalid)

	counts := &counter{}
	newWorker := func(shutdown time.Duration) (*consumer.Consumer, *kafka.Source, error) {
		cfg := kafka.Config{Brokers: cluster.Brokers(), Group: run, Topics: []string{topic}}
		if embedded {
			cfg.MaxWait = kafkatest.MaxWait
			cfg.SessionTimeout = kafkatest.SessionTimeout
			cfg.HeartbeatInterval = kafkatest.HeartbeatInterval
		}
		src, err := kafka.New(pool, cfg)
		if err != nil {
			return nil, nil, err
		}
		strategy, err := idset.New(idset.Config{})
		if err != nil {
			return nil, nil, err
		}
		c, err := consumer.New(pool, src, consumer.Config{
			Name:            "quickstart",
			Scope:           run,
			Strategy:        strategy,
			KeyFunc:         consumer.JSONField("id"),
			Handler:         consumer.JSON(apply),
			BatchSize:       200,
			RetryBackoff:    10 * time.Millisecond,
			ShutdownTimeout: shutdown,
			Hooks:           []consumer.Hook{counts},
			// Without a Logger, warnings and errors go to stderr. This demo
			// crashes workers and parks invalid transfers on purpose, and
			// its report says what happened, so it keeps them quiet.
			Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			return nil, nil, err
		}
		return c, src, c.Migrate(ctx) // the parked, markers and offsets tables
	}

	// The steady worker.
	steady, steadySrc, err := newWorker(30 * time.Second)
	if err != nil {
		return err
	}
	stopSteady, steadyDone := start(ctx, steady)

	// allSettled reads from the database how many transfers are booked (ledger
	// rows) and parked; every transfer is settled when they add up to all
	// of them. The outcomes the hooks count are for the progress line only:
	// the database is what says the work is done.
	parkedStore := steady.Parked()
	var booked, parkedNow int64
	allSettled := func() (bool, error) {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger WHERE transfer_id LIKE $1 || '/%'`, run).Scan(&booked); err != nil {
			return false, err
		}
		p, err := parkedStore.Count(ctx, parked.Filter{Scope: run})
		if err != nil {
			return false, err
		}
		parkedNow = p
		return booked+parkedNow >= int64(valid+invalid), nil
	}

	// The crashing worker: a shutdown timeout of a nanosecond abandons its
	// batch in flight, like a crash; its replacement (and the steady
	// worker, after the rebalance) resume from the offsets in Postgres.
	start0 := time.Now()
	deadline := start0.Add(timeout)
	crashes := 0
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	settled := false
	for !settled {
		if time.Now().After(deadline) {
			return fmt.Errorf("not every transfer was booked or parked within %s: %d booked, %d parked of %d transfers (-timeout sets the bound)",
				timeout, booked, parkedNow, valid+invalid)
		}
		c, src, err := newWorker(time.Nanosecond)
		if err != nil {
			return err
		}
		stop, done := start(ctx, c)
		crash := time.After(time.Duration(150+rng.IntN(300)) * time.Millisecond)
		tick := time.NewTicker(50 * time.Millisecond)
	life:
		for {
			select {
			case <-tick.C:
				if settled, err = allSettled(); err != nil {
					return err
				}
				fmt.Printf("\r  booked %6d of %d   duplicates skipped %5d   parked %2d   crashes %2d", booked, valid, counts.get().Duplicate, parkedNow, crashes)
				if settled {
					break life
				}
			case <-crash:
				crashes++
				break life
			}
		}
		tick.Stop()
		stop()
		if err := <-done; err != nil && !errors.Is(err, consumer.ErrShutdownTimeout) {
			return err // a crash abandons its batch in flight; anything else is a failure
		}
		_ = src.Close()
	}
	stopSteady()
	if err := <-steadyDone; err != nil {
		return err
	}
	_ = steadySrc.Close()
	elapsed := time.Since(start0)

	var got int64
	var rows, distinct int
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(amount), 0), count(*), count(DISTINCT transfer_id) FROM ledger WHERE transfer_id LIKE $1 || '/%'`, run).Scan(&got, &rows, &distinct); err != nil {
		return err
	}
	parked64, err := parkedStore.Count(ctx, parked.Filter{Scope: run})
	if err != nil {
		return err
	}
	parked := int(parked64)
	s := counts.get()
	fmt.Printf("\n\nreport (%s)\n", elapsed.Round(time.Millisecond))
	fmt.Printf("  messages produced     %7d\n", produced)
	fmt.Printf("  deliveries            %7d  (%d worker crashes)\n", s.Delivered, crashes)
	fmt.Printf("  applied               %7d\n", s.Applied)
	fmt.Printf("  duplicates skipped    %7d\n", s.Duplicate)
	fmt.Printf("  parked                %7d  (invalid transfers: %d)\n", parked, invalid)
	fmt.Printf("  ledger rows           %7d  (%d distinct transfers)\n", rows, distinct)
	fmt.Printf("  ledger total    %13d\n  expected total  %13d\n", got, want)
	if got != want || rows != valid || distinct != rows || parked != invalid {
		return fmt.Errorf("CHECK FAILED: the ledger does not match the transfers")
	}
	fmt.Println("\nOK: every transfer applied exactly once; the invalid ones are parked")
	return nil
}

// produce writes n transfers, keyed by account so an account's transfers
// stay in order; every 40th is sent twice and every 500th is invalid.
func produce(ctx context.Context, cluster *kafkatest.Cluster, run string, n int) (topic string, want int64, valid, invalid, produced int, err error) {
	topic = run
	if err = cluster.CreateTopic(ctx, topic, 4); err != nil {
		return
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var msgs []kafkago.Message
	for i := range n {
		t := Transfer{ID: fmt.Sprintf("%s/t-%06d", run, i), Account: fmt.Sprintf("acct-%02d", rng.IntN(20)), Amount: rng.Int64N(10000) - 3000}
		body, _ := json.Marshal(t)
		switch {
		case i%500 == 499:
			body = []byte(`{"id": "` + t.ID + `", "amount": "not a number"}`)
			invalid++
		case t.Amount == 0:
			invalid++ // refused by the handler
		default:
			want += t.Amount
			valid++
		}
		m := kafkago.Message{Key: []byte(t.Account), Value: body}
		msgs = append(msgs, m)
		if i%40 == 0 {
			msgs = append(msgs, m)
		}
	}
	w := &kafkago.Writer{
		Addr:         kafkago.TCP(cluster.Brokers()...),
		Topic:        topic,
		Balancer:     &kafkago.Hash{},
		BatchTimeout: kafkatest.BatchTimeout,
		BatchSize:    1000,
		RequiredAcks: kafkago.RequireAll,
	}
	defer w.Close()
	if err = w.WriteMessages(ctx, msgs...); err != nil {
		return
	}
	return topic, want, valid, invalid, len(msgs), nil
}

// start runs c until the returned stop is called.
func start(ctx context.Context, c *consumer.Consumer) (stop func(), done <-chan error) {
	ctx, cancel := context.WithCancel(ctx)
	ch := make(chan error, 1)
	go func() { ch <- c.Run(ctx) }()
	return cancel, ch
}

// counter totals batch outcomes for the progress line and the report.
type counter struct {
	mu sync.Mutex
	s  totals
}

type totals struct{ Delivered, Applied, Duplicate, Parked int }

func (c *counter) BatchDone(_ context.Context, s *consumer.BatchStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.s.Delivered += s.Size
	c.s.Applied += s.Applied
	c.s.Duplicate += s.Duplicate + s.Mismatch
	c.s.Parked += s.Parked
}

func (c *counter) get() totals {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s
}
