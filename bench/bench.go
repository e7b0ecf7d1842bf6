// Package bench measures the consumer against the two things a team would
// otherwise use: a naive consumer that commits one transaction per message,
// and the raw limit of the same rows written with batched SQL and no
// framework. Every variant writes one marker and one effect row per message
// into the same database, one after another, so their rates compare.
//
// The testing.B functions in this package run each variant; the
// cmd/benchtable command runs them all side by side and prints the table
// BENCHMARKS.md shows.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Variant is one way of processing messages.
type Variant struct {
	Name  string
	Batch int
	// Run processes n new messages and returns how long it took.
	Run func(ctx context.Context, pool *pgxpool.Pool, n, batch int) (time.Duration, error)
}

// Variants returns the measured variants in table order.
func Variants() []Variant {
	return []Variant{
		{"naive: one transaction per message", 1, Naive},
		{"engine, Handler", 1, Engine(false)},
		{"engine, Handler", 100, Engine(false)},
		{"engine, Handler", 500, Engine(false)},
		{"engine, QueueHandler", 100, EngineQueue},
		{"engine, QueueHandler", 500, EngineQueue},
		{"engine, QueueHandler, NoInsertMerge", 500, EngineQueueUnmerged},
		{"engine, BatchHandler", 100, Engine(true)},
		{"engine, BatchHandler", 500, Engine(true)},
		{"raw: unnest markers + effects", 500, Raw},
	}
}

// Setup creates the effect table and the library's tables in pool's
// database, empty.
func Setup(ctx context.Context, pool *pgxpool.Pool) error {
	s, err := idset.New(idset.Config{})
	if err != nil {
		return err
	}
	lines := append(s.Migrations(), parked.Line("", ""))
	if _, err := pg.Migrate(ctx, pool, "", lines...); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS ledger (
    msg_id  text   NOT NULL,
    account text   NOT NULL,
    amount  bigint NOT NULL
);
TRUNCATE ledger, effectively.processed, effectively.parked;`)
	return err
}

// Reset empties the tables between runs.
func Reset(ctx context.Context, pool *pgxpool.Pool) error {
	for _, q := range []string{
		`TRUNCATE ledger, effectively.processed, effectively.parked`,
		`VACUUM ANALYZE ledger`,
		`VACUUM ANALYZE effectively.processed`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

func message(i int) (id, account string, amount int64, payload []byte) {
	id = fmt.Sprintf("transfer-%08d", i)
	account = fmt.Sprintf("acct-%03d", i%500)
	amount = int64(i%1000 + 1)
	payload = fmt.Appendf(nil, `{"id":%q,"account":%q,"amount":%d}`, id, account, amount)
	return
}

// Naive is the hand-written consumer: for each message, one transaction that
// looks up the key, inserts it, applies the effect and commits.
func Naive(ctx context.Context, pool *pgxpool.Pool, n, _ int) (time.Duration, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	start := time.Now()
	for i := range n {
		id, account, amount, payload := message(i)
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var seen bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM effectively.processed WHERE scope = $1 AND id = $2)`, "bench", id).Scan(&seen); err != nil {
				return err
			}
			if seen {
				return nil
			}
			if _, err := tx.Exec(ctx, `INSERT INTO effectively.processed (scope, id, fingerprint) VALUES ($1, $2, $3)`, "bench", id, dedupe.Fingerprint(payload)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO ledger (msg_id, account, amount) VALUES ($1, $2, $3)`, id, account, amount)
			return err
		})
		if err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// Raw writes the same marker and effect rows in batches with two unnest
// statements per transaction and nothing else: the limit for this schema.
func Raw(ctx context.Context, pool *pgxpool.Pool, n, batch int) (time.Duration, error) {
	start := time.Now()
	if err := raw(ctx, pool, 0, n, batch); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// raw writes the rows of messages from up to end as Raw does.
func raw(ctx context.Context, pool *pgxpool.Pool, from, end, batch int) error {
	for lo := from; lo < end; lo += batch {
		hi := min(lo+batch, end)
		scopes := make([]string, 0, hi-lo)
		ids := make([]string, 0, hi-lo)
		fps := make([][]byte, 0, hi-lo)
		accounts := make([]string, 0, hi-lo)
		amounts := make([]int64, 0, hi-lo)
		for i := lo; i < hi; i++ {
			id, account, amount, payload := message(i)
			scopes = append(scopes, "bench")
			ids = append(ids, id)
			fps = append(fps, dedupe.Fingerprint(payload))
			accounts = append(accounts, account)
			amounts = append(amounts, amount)
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			return rawRows(ctx, tx, scopes, ids, fps, accounts, amounts)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// rawRows writes one batch as Raw does: the markers of a processed-ID
// table and the ledger rows, one unnest statement each.
func rawRows(ctx context.Context, tx pgx.Tx, scopes, ids []string, fps [][]byte, accounts []string, amounts []int64) error {
	if _, err := tx.Exec(ctx, `INSERT INTO effectively.processed (scope, id, fingerprint)
SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[]) ON CONFLICT DO NOTHING`, scopes, ids, fps); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `INSERT INTO ledger (msg_id, account, amount)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`, ids, accounts, amounts)
	return err
}

type transfer struct {
	ID      string `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// Engine runs the consumer with the idset strategy on one lane, with a
// per-message Handler or a BatchHandler that writes the batch's effects
// with one unnest statement.
func Engine(batchHandler bool) func(ctx context.Context, pool *pgxpool.Pool, n, batch int) (time.Duration, error) {
	return func(ctx context.Context, pool *pgxpool.Pool, n, batch int) (time.Duration, error) {
		return engine(ctx, pool, n, batch, func(cfg *consumer.Config) { setHandler(cfg, batchHandler) })
	}
}

// EngineQueue runs the consumer as Engine does, with a per-message
// QueueHandler that queues one INSERT per message; the consumer merges a
// batch's INSERTs into multi-row ones.
func EngineQueue(ctx context.Context, pool *pgxpool.Pool, n, batch int) (time.Duration, error) {
	return engine(ctx, pool, n, batch, func(cfg *consumer.Config) { cfg.QueueHandler = queueTransfer })
}

// EngineQueueUnmerged is EngineQueue with Config.NoInsertMerge: the
// batch's INSERTs are pipelined one per message, as a QueueHandler's
// statements that cannot be merged (upserts, updates) are.
func EngineQueueUnmerged(ctx context.Context, pool *pgxpool.Pool, n, batch int) (time.Duration, error) {
	return engine(ctx, pool, n, batch, func(cfg *consumer.Config) {
		cfg.QueueHandler, cfg.NoInsertMerge = queueTransfer, true
	})
}

var queueTransfer = consumer.JSONQueue(func(ctx context.Context, q consumer.Queue, m *consumer.Message, t transfer) error {
	q.Queue(`INSERT INTO ledger (msg_id, account, amount) VALUES ($1, $2, $3)`, t.ID, t.Account, t.Amount)
	return nil
})

// engine runs the consumer configured by handler on one lane with the
// idset strategy, until it has applied n messages.
func engine(ctx context.Context, pool *pgxpool.Pool, n, batch int, handler func(*consumer.Config)) (time.Duration, error) {
	p, err := prepare(pool, n, batch, 1, handler)
	if err != nil {
		return 0, err
	}
	return p.Run(ctx)
}

// Prepared is a consumer with its messages published on the test broker,
// ready to Run: what it measures is the consumer alone.
type Prepared struct {
	pool   *pgxpool.Pool
	c      *consumer.Consumer
	broker *consumertest.Broker
	n      int
}

// prepare publishes n messages over lanes lanes (message i on lane i mod
// lanes) and makes a consumer with the idset strategy that runs lanes
// batches at once, configured by handler.
func prepare(pool *pgxpool.Pool, n, batch, lanes int, handler func(*consumer.Config)) (*Prepared, error) {
	broker := consumertest.New(consumertest.Config{Lanes: lanes})
	for i := range n {
		id, _, _, payload := message(i)
		broker.Publish(i%lanes, consumer.Message{ID: id, Value: payload})
	}
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		return nil, err
	}
	cfg := consumer.Config{Name: "bench", Strategy: strategy, BatchSize: batch, Concurrency: lanes}
	handler(&cfg)
	c, err := consumer.New(pool, broker, cfg)
	if err != nil {
		return nil, err
	}
	return &Prepared{pool: pool, c: c, broker: broker, n: n}, nil
}

// Run runs the consumer until the broker has delivered and settled every
// message, checks that the ledger has one row per message, and returns how
// long the run took.
func (p *Prepared) Run(ctx context.Context) (time.Duration, error) {
	elapsed, err := runUntilIdle(ctx, p.c, p.broker)
	if err != nil {
		return 0, err
	}
	var rows int
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&rows); err != nil {
		return 0, err
	}
	if rows != p.n {
		return 0, fmt.Errorf("ledger has %d rows after %d messages", rows, p.n)
	}
	return elapsed, nil
}

// setHandler sets Engine's handler.
func setHandler(cfg *consumer.Config, batchHandler bool) {
	if batchHandler {
		cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
			ids := make([]string, len(msgs))
			accounts := make([]string, len(msgs))
			amounts := make([]int64, len(msgs))
			for i, m := range msgs {
				var t transfer
				if err := json.Unmarshal(m.Value, &t); err != nil {
					return consumer.Permanent(err)
				}
				ids[i], accounts[i], amounts[i] = t.ID, t.Account, t.Amount
			}
			_, err := tx.Exec(ctx, `INSERT INTO ledger (msg_id, account, amount)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`, ids, accounts, amounts)
			return err
		}
	} else {
		cfg.Handler = consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, t transfer) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger (msg_id, account, amount) VALUES ($1, $2, $3)`, t.ID, t.Account, t.Amount)
			return err
		})
	}
}

// runUntilIdle runs c until broker has delivered and settled everything,
// and returns how long that took.
func runUntilIdle(ctx context.Context, c *consumer.Consumer, broker *consumertest.Broker) (time.Duration, error) {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	for !broker.Idle() {
		select {
		case err := <-done:
			return 0, fmt.Errorf("consumer stopped early: %v", err)
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Microsecond):
		}
	}
	elapsed := time.Since(start)
	cancel()
	if err := <-done; err != nil {
		return 0, err
	}
	return elapsed, nil
}
