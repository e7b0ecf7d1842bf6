package sqs_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// e2e is one end-to-end test's queue, database and effect table.
type e2e struct {
	t      testing.TB
	c      *awssqs.Client
	queue  string
	pool   *pgxpool.Pool
	hooks  *consumertest.Counter
	logger *slog.Logger
}

func newE2E(t testing.TB, queue string) *e2e {
	t.Helper()
	return newE2EOn(t, queue, pgtest.NewPool(t))
}

// newE2EOn is newE2E on the database of pool.
func newE2EOn(t testing.TB, queue string, pool *pgxpool.Pool) *e2e {
	t.Helper()
	_, err := pool.Exec(context.Background(), `CREATE TABLE effects (
		n       bigserial PRIMARY KEY,
		msg_id  text NOT NULL,
		lane    text NOT NULL,
		payload bytea NOT NULL
	)`) // deliberately no unique constraint on msg_id: a second effect must be countable
	if err != nil {
		t.Fatal(err)
	}
	e := &e2e{t: t, c: client(t), queue: queue, pool: pool, hooks: &consumertest.Counter{}, logger: consumertest.Logger()}
	return e
}

// source makes a Source on the test's queue.
func (e *e2e) source(cfg sqs.Config) *sqs.Source {
	e.t.Helper()
	cfg = quick(cfg)
	if cfg.Logger == nil {
		cfg.Logger = e.logger
	}
	return newSource(e.t, e.c, e.queue, cfg)
}

// consumer makes a migrated consumer reading src, with the idset strategy.
func (e *e2e) consumer(src consumer.Source, cfg consumer.Config) *consumer.Consumer {
	e.t.Helper()
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
		cfg.BatchHandler = insertEffects
	}
	if cfg.KeyFunc == nil {
		cfg.KeyFunc = sqs.ParkUnreadable(nil)
	}
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = 10 * time.Millisecond
	}
	if cfg.MaxRetryBackoff == 0 {
		cfg.MaxRetryBackoff = 10 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = e.logger
	}
	cfg.Hooks = append(cfg.Hooks, e.hooks)
	return consumertest.NewConsumer(e.t, e.pool, src, cfg)
}

// waitFor polls cond until it holds or timeout passes.
func (e *e2e) waitFor(what string, timeout time.Duration, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			v, f := queueDepth(e.t, e.c, e.queue)
			e.t.Fatalf("timed out after %s waiting for %s; queue: %d visible, %d in flight; stats %+v", timeout, what, v, f, e.hooks.Total())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// drained reports whether the effects cover n distinct messages and the
// queue is empty.
func (e *e2e) drained(n int) func() bool {
	return func() bool {
		if e.distinctEffects() < n {
			return false
		}
		v, f := queueDepth(e.t, e.c, e.queue)
		return v == 0 && f == 0
	}
}

func insertEffect(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, lane, payload) VALUES ($1, $2, $3)`, m.DedupeKey.ID, m.Lane, m.Value)
	return err
}

func insertEffects(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
	ids := make([]string, len(msgs))
	lanes := make([]string, len(msgs))
	payloads := make([][]byte, len(msgs))
	for i, m := range msgs {
		ids[i], lanes[i], payloads[i] = m.DedupeKey.ID, m.Lane, m.Value
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, lane, payload) SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[])`, ids, lanes, payloads)
	return err
}

// distinctEffects returns how many distinct dedupe IDs have an effect.
func (e *e2e) distinctEffects() int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(DISTINCT msg_id) FROM effects`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// effectCounts returns how many effect rows each dedupe ID has.
func (e *e2e) effectCounts() map[string]int {
	e.t.Helper()
	return consumertest.EffectCounts(e.t, e.pool, "effects", "msg_id")
}

// expectOnce fails unless exactly the IDs in want have one effect each.
func (e *e2e) expectOnce(want []string) {
	e.t.Helper()
	got := e.effectCounts()
	for _, id := range want {
		if got[id] != 1 {
			e.t.Errorf("message %s has %d effects, want 1", id, got[id])
		}
	}
	if len(got) != len(want) {
		e.t.Errorf("effects for %d distinct messages, want %d", len(got), len(want))
	}
}

// parked returns the rows of the default parked table.
func (e *e2e) parked() []consumertest.ParkedRow {
	e.t.Helper()
	return consumertest.Parked(e.t, e.pool, "", "")
}

// faultySource wraps a Source and loses acknowledgements: drop decides, per
// acknowledged message, whether its delete is lost (the message is then
// abandoned, as after a crash between the commit and the delete).
type faultySource struct {
	*sqs.Source
	mu   sync.Mutex
	drop func(m *consumer.Message) bool
	lost int
	dead bool
}

// die makes every later Settle lose all its deletes, as if the process had
// died right after each commit.
func (f *faultySource) die() {
	f.mu.Lock()
	f.dead = true
	f.mu.Unlock()
}

func (f *faultySource) Settle(ctx context.Context, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	f.mu.Lock()
	var kept []*consumer.Message
	for _, m := range ack {
		if f.dead || (f.drop != nil && f.drop(m)) {
			f.lost++
			continue
		}
		kept = append(kept, m)
	}
	f.mu.Unlock()
	return f.Source.Settle(ctx, b, kept, retry)
}

func (f *faultySource) lostAcks() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lost
}
