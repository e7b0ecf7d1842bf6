// Command kafka-ledger is a ledger worker. Transfers arrive on a Kafka topic,
// keyed by the paying account so that one account's transfers stay in
// order; the worker books each transfer exactly once into PostgreSQL (two
// entries and two balance updates), although Kafka delivers at least once,
// rebalances hand partitions between workers, and producers retry sends.
//
// How: the transfer's ID travels in the "idempotency-key" header; the idset
// strategy records it in the same transaction as the entries, together with
// the partition's next offset (sources/kafka keeps offsets in Postgres, so a
// worker that lost its partition in a rebalance cannot commit). A transfer
// that cannot be read, or that is invalid, is parked in Postgres with the
// reason, and the partition moves on.
//
// Run it as a self-checking demo on an embedded Kafka (franz-go's kfake,
// in-process) and a throwaway PostgreSQL:
//
//	go run ./examples/kafka-ledger
//
// It creates the topic, produces transfers (some sent twice, as a retrying
// producer does, and a few broken ones), books them, prints the outcome and
// checks that the books balance. Against real infrastructure it runs until
// interrupted:
//
//	KAFKA_BROKERS=localhost:9092 DATABASE_URL=postgres://... go run ./examples/kafka-ledger
//
// Add -demo to produce the demo transfers to the real cluster first.
//
// Environment: KAFKA_BROKERS (comma-separated; unset: embedded), KAFKA_TOPIC
// (default "transfers"), KAFKA_GROUP (default "ledger"), DATABASE_URL (unset:
// a throwaway server from the machine's PostgreSQL binaries).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

// Transfer is the payload of one message.
type Transfer struct {
	ID     string `json:"id"`
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount"` // cents, positive
}

const schema = `
CREATE TABLE IF NOT EXISTS ledger_entries (
    id          bigserial   PRIMARY KEY,
    transfer_id text        NOT NULL,
    account     text        NOT NULL,
    amount      bigint      NOT NULL,
    booked_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS ledger_accounts (
    account text   PRIMARY KEY,
    balance bigint NOT NULL
);`

// book writes the entries of a batch's new transfers and moves the balances,
// in one statement. A transfer that does not decode, or is invalid, fails
// permanently; the consumer isolates it and parks it, and books the rest.
func book(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
	var ids, accounts []string
	var amounts []int64
	for _, m := range msgs {
		var t Transfer
		if err := json.Unmarshal(m.Value, &t); err != nil {
			return &consumer.DecodeError{Err: fmt.Errorf("%s: %w", m.Ref, err)}
		}
		if t.Amount <= 0 || t.From == "" || t.To == "" || t.From == t.To {
			return consumer.Permanent(fmt.Errorf("%s: invalid transfer %+v", m.Ref, t))
		}
		ids = append(ids, m.DedupeKey.ID, m.DedupeKey.ID)
		accounts = append(accounts, t.From, t.To)
		amounts = append(amounts, -t.Amount, t.Amount)
	}
	_, err := tx.Exec(ctx, `
WITH e AS (
    INSERT INTO ledger_entries (transfer_id, account, amount)
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])
    RETURNING account, amount
)
INSERT INTO ledger_accounts (account, balance)
SELECT account, sum(amount) FROM e GROUP BY account
ON CONFLICT (account) DO UPDATE SET balance = ledger_accounts.balance + EXCLUDED.balance`,
		ids, accounts, amounts)
	return err
}

// tally counts outcomes, so the demo knows when it is done.
type tally struct {
	mu                         sync.Mutex
	applied, duplicate, parked int
	changed                    chan struct{}
}

func (t *tally) BatchDone(_ context.Context, s *consumer.BatchStats) {
	t.mu.Lock()
	t.applied += s.Applied
	t.duplicate += s.Duplicate + s.Mismatch
	t.parked += s.Parked
	t.mu.Unlock()
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

func (t *tally) settled() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.applied + t.duplicate + t.parked
}

func main() {
	brokers := os.Getenv("KAFKA_BROKERS")
	demo := flag.Bool("demo", brokers == "", "produce demo transfers, book them, check the books and exit")
	n := flag.Int("n", 20000, "demo: number of transfers")
	verbose := flag.Bool("v", false, "log what the consumer does")
	flag.Parse()
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log, *demo, *n); err != nil {
		fmt.Fprintln(os.Stderr, "kafka-ledger:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger, demo bool, n int) error {
	topic := envOr("KAFKA_TOPIC", "transfers")
	group := envOr("KAFKA_GROUP", "ledger")

	// Kafka: the cluster in KAFKA_BROKERS, or an embedded one.
	cluster, err := kafkatest.Start()
	if err != nil {
		return err
	}
	defer cluster.Close()
	embedded := cluster.Fake() != nil

	pool, closeDB, err := pgtest.EnvPool(ctx, pgtest.Options{}, nil) // DATABASE_URL, or a throwaway server
	if err != nil {
		return err
	}
	defer closeDB()
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("ledger schema: %w", err)
	}

	produced := 0
	if demo {
		if produced, err = produceDemo(ctx, cluster, topic, embedded, n); err != nil {
			return err
		}
		fmt.Printf("produced %d messages to %s (%d transfers, some sent twice, some broken)\n", produced, topic, n)
	}

	cfg := kafka.Config{
		Brokers: cluster.Brokers(),
		Group:   group,
		Topics:  []string{topic},
		Logger:  log,
	}
	if embedded { // quick settings for the in-process cluster
		cfg.MaxWait = kafkatest.MaxWait
		cfg.SessionTimeout = kafkatest.SessionTimeout
		cfg.HeartbeatInterval = kafkatest.HeartbeatInterval
	}
	src, err := kafka.New(pool, cfg)
	if err != nil {
		return err
	}
	defer src.Close()
	strategy, err := idset.New(idset.Config{Retention: 14 * 24 * time.Hour})
	if err != nil {
		return err
	}
	t := &tally{changed: make(chan struct{}, 1)}
	c, err := consumer.New(pool, src, consumer.Config{
		Name:         "ledger",
		Strategy:     strategy,
		BatchHandler: book,
		BatchSize:    500,
		Hooks:        []consumer.Hook{t},
		Logger:       log,
	})
	if err != nil {
		return err
	}
	if err := c.Migrate(ctx); err != nil { // the parked, markers and Kafka offsets tables
		return err
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	if demo {
		start := time.Now()
		for t.settled() < produced && ctx.Err() == nil {
			select {
			case <-t.changed:
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		fmt.Printf("settled %d messages in %s\n", t.settled(), time.Since(start).Round(time.Millisecond))
		cancel()
	}
	if err := <-done; err != nil {
		return err
	}
	if err := src.Close(); err != nil {
		return err
	}
	if demo {
		return check(ctx, pool, c, t, n)
	}
	return nil
}

// produceDemo writes n transfers between a handful of accounts, keyed by the
// paying account; every 50th is sent twice (a producer retry), and three
// broken messages are mixed in. It returns the number of messages written.
func produceDemo(ctx context.Context, cluster *kafkatest.Cluster, topic string, embedded bool, n int) (int, error) {
	if embedded {
		if err := cluster.CreateTopic(ctx, topic, 4); err != nil {
			return 0, err
		}
	}
	accounts := []string{"alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"}
	var msgs []kafkago.Message
	for i := range n {
		t := Transfer{ID: fmt.Sprintf("tr-%06d", i), From: accounts[i%len(accounts)], To: accounts[(i*3+1)%len(accounts)], Amount: int64(100 + i%900)}
		if t.From == t.To {
			t.To = accounts[(i+1)%len(accounts)]
		}
		body, _ := json.Marshal(t)
		m := kafkago.Message{Key: []byte(t.From), Value: body, Headers: []kafkago.Header{{Key: kafka.DefaultIDHeader, Value: []byte(t.ID)}}}
		msgs = append(msgs, m)
		if i%50 == 0 {
			msgs = append(msgs, m)
		}
	}
	msgs = append(msgs,
		kafkago.Message{Key: []byte("alice"), Value: []byte(`{"id": "tr-x1", "from": "alice", "to": `), Headers: []kafkago.Header{{Key: kafka.DefaultIDHeader, Value: []byte("tr-x1")}}},
		kafkago.Message{Key: []byte("bob"), Value: []byte(`{"id": "tr-x2", "from": "bob", "to": "carol", "amount": -5}`), Headers: []kafkago.Header{{Key: kafka.DefaultIDHeader, Value: []byte("tr-x2")}}},
		kafkago.Message{Key: []byte("carol"), Value: []byte(`{"id": "tr-x3", "from": "carol", "to": "dave", "amount": "ten"}`)}, // no header either
	)
	w := &kafkago.Writer{
		Addr:         kafkago.TCP(cluster.Brokers()...),
		Topic:        topic,
		Balancer:     &kafkago.Hash{},
		BatchTimeout: kafkatest.BatchTimeout,
		BatchSize:    1000,
		RequiredAcks: kafkago.RequireAll,
	}
	defer w.Close()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return 0, fmt.Errorf("produce: %w", err)
	}
	return len(msgs), nil
}

// check verifies the demo's books: every transfer booked once (two
// entries), the balances sum to zero, and the broken messages parked.
func check(ctx context.Context, pool *pgxpool.Pool, c *consumer.Consumer, t *tally, n int) error {
	var entries, transfers int
	var sum int64
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT transfer_id) FROM ledger_entries`).Scan(&entries, &transfers); err != nil {
		return err
	}
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(balance), 0) FROM ledger_accounts`).Scan(&sum); err != nil {
		return err
	}
	// What the consumer parked, through its parked store: the rows of its
	// scope (its Name, "ledger", unless Config.Scope says otherwise).
	rows, err := c.Parked().List(ctx, parked.Filter{Scope: c.Config().Scope})
	if err != nil {
		return err
	}
	var parked []string
	for _, p := range rows {
		parked = append(parked, fmt.Sprintf("  %s  %s: %s", p.Ref, p.Reason, p.LastError))
	}
	fmt.Printf("booked %d transfers (%d entries), skipped %d duplicate deliveries, parked %d:\n%s\n",
		transfers, entries, t.duplicate, len(parked), strings.Join(parked, "\n"))
	fmt.Printf("sum of balances: %d\n", sum)
	var problems []string
	if transfers != n || entries != 2*n {
		problems = append(problems, fmt.Sprintf("want %d transfers in %d entries", n, 2*n))
	}
	if sum != 0 {
		problems = append(problems, "the balances do not sum to zero")
	}
	if len(parked) != 3 {
		problems = append(problems, "want the 3 broken messages parked")
	}
	if len(problems) > 0 {
		return errors.New("check failed: " + strings.Join(problems, "; "))
	}
	fmt.Println("check passed: every transfer booked exactly once")
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
