// Command quickstart is a ledger worker that applies each transfer exactly
// once although its broker delivers some transfers twice, loses
// acknowledgements and crashes mid-stream.
//
//	go run ./examples/quickstart
//
// It uses DATABASE_URL when set, else it starts a throwaway PostgreSQL. The
// broker is the in-memory consumertest.Broker; see examples/kafka-ledger and
// examples/sqs-webhooks for the same worker on Kafka and SQS. It prints
// progress, then a report, and exits with status 1 if the ledger total is
// not the sum of the transfers.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Transfer is the message payload.
type Transfer struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// apply is the business effect: one ledger row per transfer, written in
// the transaction that also records the transfer as processed.
func apply(ctx context.Context, tx pgx.Tx, m *consumer.Message, t Transfer) error {
	if t.Amount == 0 {
		return consumer.Permanent(fmt.Errorf("transfer %s has no amount", t.ID))
	}
	_, err := tx.Exec(ctx, `INSERT INTO ledger (transfer_id, account, amount) VALUES ($1, $2, $3)`, t.ID, t.Account, t.Amount)
	return err
}

func main() {
	n := flag.Int("transfers", 20000, "number of transfers to publish")
	flag.Parse()
	if err := run(*n); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(n int) error {
	ctx := context.Background()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		fmt.Println("starting a throwaway PostgreSQL (set DATABASE_URL to use yours)…")
		cluster, err := pgtest.Start(ctx, pgtest.Options{})
		if err != nil {
			return err
		}
		defer cluster.Stop()
		url = cluster.URL()
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS ledger (
    transfer_id text   NOT NULL,
    account     text   NOT NULL,
    amount      bigint NOT NULL
)`); err != nil {
		return err
	}
	// A fresh scope per run, so the demo can run again on the same database.
	scope := fmt.Sprintf("quickstart-%d", time.Now().UnixNano())

	// Publish the transfers; every 500th is malformed and will be parked.
	broker := consumertest.New(consumertest.Config{Lanes: 4, DuplicateRate: 0.2, LostAckRate: 0.02, Seed: uint64(time.Now().UnixNano())})
	var want int64
	malformed := 0
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		t := Transfer{ID: fmt.Sprintf("%s/t-%06d", scope, i), Account: fmt.Sprintf("acct-%02d", rng.IntN(20)), Amount: rng.Int64N(10000) - 3000}
		body := fmt.Sprintf(`{"id":%q,"account":%q,"amount":%d}`, t.ID, t.Account, t.Amount)
		if i%500 == 499 {
			body = `{"id": "` + t.ID + `", "amount": "not a number"}`
			malformed++
		} else if t.Amount == 0 {
			malformed++ // refused by the handler, parked
		} else {
			want += t.Amount
		}
		broker.Publish(i, consumer.Message{ID: t.ID, Value: []byte(body)})
	}

	strategy, err := idset.New(idset.Config{})
	if err != nil {
		return err
	}
	counts := &counter{}
	cfg := consumer.Config{
		Name:         "quickstart",
		Scope:        scope,
		Strategy:     strategy,
		Handler:      consumer.JSON(apply),
		BatchSize:    200,
		RetryBackoff: 10 * time.Millisecond,
		Hooks:        []consumer.Hook{counts},
	}

	// Run the worker in several lifetimes: every so often the process
	// "crashes" (the broker forgets unacknowledged work) and restarts.
	start := time.Now()
	for life := 1; !broker.Idle(); life++ {
		c, err := consumer.New(pool, broker, cfg)
		if err != nil {
			return err
		}
		if err := c.Migrate(ctx); err != nil {
			return err
		}
		lctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(lctx) }()
		crashAt := time.After(time.Duration(700+rng.IntN(800)) * time.Millisecond)
		tick := time.NewTicker(250 * time.Millisecond)
	life:
		for {
			select {
			case <-tick.C:
				s := counts.get()
				fmt.Printf("\r  applied %6d of %d   duplicates %6d   parked %3d   (lifetime %d)", s.Applied, n-malformed, s.Duplicate+s.Mismatch, s.Parked, life)
				if broker.Idle() {
					break life
				}
			case <-crashAt:
				broker.Crash()
				break life
			}
		}
		tick.Stop()
		cancel()
		if err := <-done; err != nil {
			return err
		}
	}
	elapsed := time.Since(start)

	var got int64
	var rows, distinct int
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(amount), 0), count(*), count(DISTINCT transfer_id) FROM ledger WHERE transfer_id LIKE $1 || '/%'`, scope).Scan(&got, &rows, &distinct); err != nil {
		return err
	}
	var parked int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM effectively.parked WHERE scope = $1`, scope).Scan(&parked); err != nil {
		return err
	}
	s, bs := counts.get(), broker.Stats()
	fmt.Printf("\n\nreport (%s)\n", elapsed.Round(time.Millisecond))
	fmt.Printf("  transfers published   %7d\n", n)
	fmt.Printf("  deliveries            %7d  (%d duplicated by the broker, %d acks lost, %d crashes)\n", bs.Delivered, bs.Duplicated, bs.LostAcks, bs.Crashes)
	fmt.Printf("  applied               %7d\n", s.Applied)
	fmt.Printf("  duplicates skipped    %7d\n", s.Duplicate+s.Mismatch)
	fmt.Printf("  parked                %7d  (malformed or refused: %d)\n", parked, malformed)
	fmt.Printf("  ledger rows           %7d  (%d distinct transfers)\n", rows, distinct)
	fmt.Printf("  ledger total    %13d\n  expected total  %13d\n", got, want)
	if got != want || rows != n-malformed || distinct != rows || parked != malformed {
		fmt.Println("\nCHECK FAILED: the ledger does not match the transfers")
		os.Exit(1)
	}
	fmt.Println("\nOK: every transfer applied exactly once; the malformed ones are parked")
	return nil
}

// counter totals batch outcomes for the progress line.
type counter struct {
	mu sync.Mutex
	s  consumer.BatchStats
}

func (c *counter) BatchDone(_ context.Context, s *consumer.BatchStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.s.Applied += s.Applied
	c.s.Duplicate += s.Duplicate
	c.s.Mismatch += s.Mismatch
	c.s.Parked += s.Parked
}

func (c *counter) get() consumer.BatchStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s
}
