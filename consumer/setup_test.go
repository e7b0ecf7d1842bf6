package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's database, broker and effect table.
type env struct {
	t      *testing.T
	pool   *pgxpool.Pool
	broker *consumertest.Broker
	hooks  *countHook
}

func newEnv(t *testing.T, bcfg consumertest.Config) *env {
	t.Helper()
	pool := pgtest.NewPool(t)
	_, err := pool.Exec(context.Background(), `CREATE TABLE effects (
		msg_id  text NOT NULL,
		lane    text NOT NULL,
		payload bytea NOT NULL
	)`) // deliberately no unique constraint: a second effect must be countable
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, pool: pool, broker: consumertest.New(bcfg), hooks: &countHook{}}
}

// config fills what every test needs around the test's own choices.
func (e *env) config(cfg consumer.Config) consumer.Config {
	if cfg.Name == "" {
		cfg.Name = "test"
	}
	if cfg.Strategy == nil {
		s, err := idset.New(idset.Config{})
		if err != nil {
			e.t.Fatal(err)
		}
		cfg.Strategy = s
	}
	if cfg.Handler == nil && cfg.BatchHandler == nil {
		cfg.Handler = insertEffect
	}
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = time.Millisecond
	}
	if cfg.MaxRetryBackoff == 0 {
		cfg.MaxRetryBackoff = 5 * time.Millisecond
	}
	if cfg.GapDelay == 0 {
		cfg.GapDelay = time.Millisecond
	}
	if cfg.Logger == nil && os.Getenv("TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	cfg.Hooks = append(cfg.Hooks, e.hooks)
	return cfg
}

func (e *env) consumer(cfg consumer.Config) *consumer.Consumer {
	e.t.Helper()
	c, err := consumer.New(e.pool, e.broker, e.config(cfg))
	if err != nil {
		e.t.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	return c
}

// runUntilIdle runs c until the broker has nothing left to deliver.
func (e *env) runUntilIdle(c *consumer.Consumer, timeout time.Duration) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(context.Background(), timeout)
	defer wcancel()
	werr := e.broker.WaitIdle(wctx)
	cancel()
	if err := <-done; err != nil {
		e.t.Fatalf("Run: %v", err)
	}
	if werr != nil {
		e.t.Fatal(werr)
	}
}

func insertEffect(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, lane, payload) VALUES ($1, $2, $3)`, m.ID, m.Lane, m.Value)
	return err
}

func insertEffects(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
	ids := make([]string, len(msgs))
	lanes := make([]string, len(msgs))
	payloads := make([][]byte, len(msgs))
	for i, m := range msgs {
		ids[i], lanes[i], payloads[i] = m.ID, m.Lane, m.Value
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, lane, payload) SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[])`, ids, lanes, payloads)
	return err
}

// effectCounts returns how many effect rows each message ID has.
func (e *env) effectCounts() map[string]int {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT msg_id, count(*) FROM effects GROUP BY msg_id`)
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		id string
		n  int
	}, error) {
		var v struct {
			id string
			n  int
		}
		return v, r.Scan(&v.id, &v.n)
	})
	if err != nil {
		e.t.Fatal(err)
	}
	m := make(map[string]int, len(out))
	for _, v := range out {
		m[v.id] = v.n
	}
	return m
}

type parkedRow struct {
	DedupeID  *string
	Reason    string
	LastError string
	Payload   []byte
	Ref       string
	HasMarker bool
	Attempts  int
}

func (e *env) parked() []parkedRow {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(),
		`SELECT dedupe_id, reason, last_error, payload, ref, has_marker, attempts FROM effectively.parked ORDER BY id`)
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[parkedRow])
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) markerExists(scope, id string) bool {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM effectively.processed WHERE scope = $1 AND id = $2`, scope, id).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n > 0
}

func msg(id string, payload string) consumer.Message {
	return consumer.Message{ID: id, Value: []byte(payload)}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// countHook totals the batch stats it sees.
type countHook struct {
	mu    sync.Mutex
	total consumer.BatchStats
	batch int
}

func (h *countHook) BatchDone(_ context.Context, s *consumer.BatchStats) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.batch++
	h.total.Size += s.Size
	h.total.Applied += s.Applied
	h.total.Duplicate += s.Duplicate
	h.total.Mismatch += s.Mismatch
	h.total.Parked += s.Parked
	h.total.Retried += s.Retried
	h.total.Gap += s.Gap
	if s.Isolated {
		h.total.Isolated = true
	}
}

func (h *countHook) get() consumer.BatchStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.total
}

var _ dedupe.Strategy = (*idset.Strategy)(nil)
