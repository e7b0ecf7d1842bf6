package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The timeouts a DBA sets on the consumer's role, as production runs it:
// each test sets them with ALTER ROLE ... IN DATABASE ... SET, and the
// consumer connects afresh, so the server applies them to its sessions.

// withRoleSettings sets settings (name → value) on the current role in
// the test's database, and replaces e.pool by a pool whose sessions have
// them. pool adjusts the new pool's config. It returns the former pool,
// whose sessions do not have them.
func (e *env) withRoleSettings(settings map[string]string, pool func(*pgxpool.Config)) (admin *pgxpool.Pool) {
	e.t.Helper()
	ctx := context.Background()
	var db string
	if err := e.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		e.t.Fatal(err)
	}
	for name, value := range settings {
		sql := "ALTER ROLE CURRENT_USER IN DATABASE " + pgx.Identifier{db}.Sanitize() + " SET " + name + " = '" + value + "'"
		if _, err := e.pool.Exec(ctx, sql); err != nil {
			e.t.Fatal(err)
		}
	}
	// DROP DATABASE drops the role's settings in it with it.
	cfg := e.pool.Config()
	if pool != nil {
		pool(cfg)
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(p.Close)
	for name, value := range settings {
		var got string
		if err := p.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&got); err != nil {
			e.t.Fatal(err)
		}
		if got != value {
			e.t.Fatalf("%s is %q in a new session, want %q", name, got, value)
		}
	}
	admin, e.pool = e.pool, p
	return admin
}

// recorder is a hook that keeps the batches' errors and the messages'
// events, and tells waiters when they change.
type recorder struct {
	mu      sync.Mutex
	errs    []error
	events  []consumer.MessageEvent
	changed chan struct{}
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{}, 1)} }

func (r *recorder) BatchDone(_ context.Context, s *consumer.BatchStats) {
	r.mu.Lock()
	if s.Err != nil {
		r.errs = append(r.errs, s.Err)
	}
	r.mu.Unlock()
	r.notify()
}

func (r *recorder) MessageDone(_ context.Context, e consumer.MessageEvent) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
	r.notify()
}

func (r *recorder) notify() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// batchErrs returns how many batches failed with an error that match
// accepts.
func (r *recorder) batchErrs(match func(error) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, err := range r.errs {
		if match(err) {
			n++
		}
	}
	return n
}

// messageEvents returns how many events of message id match accepts.
func (r *recorder) messageEvents(id string, match func(consumer.MessageEvent) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Message.ID == id && match(e) {
			n++
		}
	}
	return n
}

// waitUntil waits for cond to hold, checking it whenever the hook saw
// something; it fails the test after timeout (a guard against a hang).
func (r *recorder) waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-r.changed:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// syncBuffer collects a logger's output from several goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A handler statement that runs past statement_timeout because of its own
// work (pg_sleep here) fails its message: retried, counted, then parked
// with an error naming the setting, while its batch-mates commit.
func TestStatementTimeoutParksTheSlowMessage(t *testing.T) {
	e := newEnv(t, consumertest.Config{Lanes: 1})
	e.withRoleSettings(map[string]string{"statement_timeout": "200ms", "lock_timeout": "50ms"}, nil)
	for _, id := range []string{"a", "slow", "b", "c"} {
		e.broker.Publish(0, msg(id, "p"))
	}
	var slowRuns atomic.Int32
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "slow" {
			slowRuns.Add(1)
			if _, err := tx.Exec(ctx, `SELECT pg_sleep(2)`); err != nil {
				return err
			}
		}
		return insertEffect(ctx, tx, m)
	}
	e.runUntilIdle(e.consumer(consumer.Config{Handler: h, MaxAttempts: 3, BatchSize: 4}), time.Minute)

	counts := e.effectCounts()
	for _, id := range []string{"a", "b", "c"} {
		if counts[id] != 1 {
			t.Errorf("%s has %d effects, want 1", id, counts[id])
		}
	}
	if counts["slow"] != 0 {
		t.Errorf("the slow message has %d effects, want 0", counts["slow"])
	}
	rows := e.parked()
	if len(rows) != 1 || rows[0].Reason != parked.ReasonMaxAttempts || rows[0].Attempts != 3 ||
		!strings.Contains(rows[0].LastError, "statement_timeout (200ms)") || !strings.Contains(rows[0].LastError, "57014") {
		t.Fatalf("parked %v: want the slow message parked after 3 attempts, its error naming statement_timeout", rows)
	}
	if n := slowRuns.Load(); n < 3 {
		t.Errorf("the slow message ran %d times, want one run per attempt, 3", n)
	}
}

// statement_timeout does not bound COMMIT: PostgreSQL stops its clock
// before COMMIT runs the deferred triggers, so a slow deferred trigger
// commits, and a query_canceled at COMMIT can only be a cancel request
// (which the consumer treats as transient). The documentation says so.
func TestStatementTimeoutDoesNotBoundCommit(t *testing.T) {
	e := newEnv(t, consumertest.Config{Lanes: 1})
	_, err := e.pool.Exec(context.Background(), `
		CREATE FUNCTION slow_check() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.msg_id = 'slow' THEN PERFORM pg_sleep(0.5); END IF;
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER slow_check AFTER INSERT ON effects
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_check();`)
	if err != nil {
		t.Fatal(err)
	}
	e.withRoleSettings(map[string]string{"statement_timeout": "100ms", "lock_timeout": "50ms"}, nil)
	for _, id := range []string{"a", "slow", "b"} {
		e.broker.Publish(0, msg(id, "p"))
	}
	e.runUntilIdle(e.consumer(consumer.Config{MaxAttempts: 2, BatchSize: 3}), time.Minute)
	if counts := e.effectCounts(); counts["a"] != 1 || counts["b"] != 1 || counts["slow"] != 1 {
		t.Errorf("effects %v, want each message once", counts)
	}
	if p := e.parked(); len(p) != 0 {
		t.Errorf("parked %v, want none", p)
	}
}

// A lock held elsewhere past lock_timeout is the database's doing, not the
// message's: the message is retried with backoff, its deliveries are not
// counted against MaxAttempts (it fails more often than that here), it is
// never parked for it, and it applies once the lock is released. Its
// batch-mates commit meanwhile.
func TestLockTimeoutIsTransient(t *testing.T) {
	e := newEnv(t, consumertest.Config{Lanes: 1})
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE accounts (id text PRIMARY KEY, n int NOT NULL); INSERT INTO accounts VALUES ('x', 0)`); err != nil {
		t.Fatal(err)
	}
	admin := e.withRoleSettings(map[string]string{"lock_timeout": "100ms", "statement_timeout": "5s"}, nil)

	// Another session holds the row lock the handler needs.
	holder, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `SELECT * FROM accounts WHERE id = 'x' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	const maxAttempts = 2
	const failuresBeforeRelease = 2*maxAttempts + 1
	var failures atomic.Int32
	manyFailures := make(chan struct{})
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "locked" {
			if _, err := tx.Exec(ctx, `UPDATE accounts SET n = n + 1 WHERE id = 'x'`); err != nil {
				if failures.Add(1) == failuresBeforeRelease {
					close(manyFailures)
				}
				return err
			}
		}
		return insertEffect(ctx, tx, m)
	}
	rec := newRecorder()
	for _, id := range []string{"a", "locked", "b"} {
		e.broker.Publish(0, msg(id, "p"))
	}
	c := e.consumer(consumer.Config{Handler: h, MaxAttempts: maxAttempts, BatchSize: 3, Hooks: []consumer.Hook{rec}})
	run := consumertest.Start(c)
	select {
	case <-manyFailures:
	case <-time.After(time.Minute):
		run.Stop(t)
		t.Fatalf("the locked message failed %d times, want %d", failures.Load(), failuresBeforeRelease)
	}
	if err := holder.Commit(ctx); err != nil { // the lock is released
		t.Fatal(err)
	}
	werr := e.broker.WaitIdle(ctxTimeout(t, time.Minute))
	run.Stop(t)
	if werr != nil {
		t.Fatal(werr)
	}

	counts := e.effectCounts()
	if counts["a"] != 1 || counts["b"] != 1 || counts["locked"] != 1 {
		t.Errorf("effects %v, want each message once", counts)
	}
	if p := e.parked(); len(p) != 0 {
		t.Errorf("parked %v, want none", p)
	}
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT n FROM accounts WHERE id = 'x'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("the account was updated %d times (%v), want once", n, err)
	}
	transient := rec.messageEvents("locked", func(ev consumer.MessageEvent) bool {
		var te *consumer.TransientError
		return ev.Outcome == consumer.OutcomeRetried && errors.As(ev.Err, &te) && consumer.IsTransient(ev.Err)
	})
	if transient < failuresBeforeRelease {
		t.Errorf("hooks saw %d retries of the locked message with a TransientError, want at least %d", transient, failuresBeforeRelease)
	}
}

// With idle_in_transaction_session_timeout set low on the role (and the
// consumer told to leave it in force), a handler that keeps its batch's
// transaction idle past it (slow work that is not the database's) has the
// server end the session (FATAL 25P03): the batch rolls back, its broken
// connection is dropped from the pool, the others are retried and commit,
// and the idle message is parked after its attempts with an error naming
// the setting, whether the idle wait comes between its statements or
// after its last one, before a batch-mate's statement finds the session
// gone.
func TestServerIdleTimeoutParksTheIdleMessage(t *testing.T) {
	for _, where := range []string{"between statements", "after its last statement"} {
		t.Run(where, func(t *testing.T) {
			e := newEnv(t, consumertest.Config{Lanes: 1})
			for _, id := range []string{"a", "slow", "b"} {
				e.broker.Publish(0, msg(id, "p"))
			}
			pause := func() { time.Sleep(1500 * time.Millisecond) } // work that is not the database's, inside the transaction
			h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if m.ID != "slow" {
					return insertEffect(ctx, tx, m)
				}
				if where == "between statements" {
					if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
						return err
					}
					pause()
					return insertEffect(ctx, tx, m)
				}
				if err := insertEffect(ctx, tx, m); err != nil {
					return err
				}
				pause()
				return nil
			}
			rec := newRecorder()
			cfg := e.config(consumer.Config{Handler: h, IdleTxTimeout: -1, MaxAttempts: 2, BatchSize: 3, Hooks: []consumer.Hook{rec}})
			consumertest.NewConsumer(t, e.pool, e.broker, cfg) // migrated before the setting
			e.withRoleSettings(map[string]string{"idle_in_transaction_session_timeout": "300ms"}, nil)
			c, err := consumer.New(e.pool, e.broker, cfg)
			if err != nil {
				t.Fatal(err)
			}
			e.runUntilIdle(c, time.Minute)

			counts := e.effectCounts()
			if counts["a"] != 1 || counts["b"] != 1 || counts["slow"] != 0 {
				t.Errorf("effects %v, want a and b once and slow never", counts)
			}
			rows := e.parked()
			if len(rows) != 1 || rows[0].Reason != parked.ReasonMaxAttempts || rows[0].Attempts != 2 ||
				!strings.Contains(rows[0].LastError, "idle_in_transaction_session_timeout") {
				t.Fatalf("parked %v: want the slow message parked after 2 attempts, its error naming idle_in_transaction_session_timeout", rows)
			}
			idle := rec.messageEvents("slow", func(ev consumer.MessageEvent) bool {
				var ie *consumer.IdleTxError
				return errors.As(ev.Err, &ie)
			})
			if idle == 0 {
				t.Errorf("hooks never saw the slow message's *IdleTxError")
			}
		})
	}
}

// A pool with fewer connections than the consumer can use at once is
// reported at start-up with the numbers: Concurrency batches, and one more
// for the strategy's background maintenance (idset's sweeper).
func TestSmallPoolWarnsAtStartup(t *testing.T) {
	for _, tc := range []struct {
		maxConns int32
		warn     bool
	}{{2, true}, {5, false}} {
		e := newEnv(t, consumertest.Config{Lanes: 4})
		e.withRoleSettings(nil, func(cfg *pgxpool.Config) { cfg.MaxConns = tc.maxConns })
		e.broker.Publish(0, msg("m", "p"))
		var logs syncBuffer
		logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		e.runUntilIdle(e.consumer(consumer.Config{Concurrency: 4, Logger: logger}), time.Minute)
		const want = "pool allows 2 connections, Concurrency 4 needs at least 5 (4 batches at once and 1 for the strategy's background work): at most 2 batches run at once"
		if got := strings.Contains(logs.String(), "pool allows"); got != tc.warn {
			t.Errorf("MaxConns %d: warned %v, want %v; logs:\n%s", tc.maxConns, got, tc.warn, logs.String())
		}
		if tc.warn && !strings.Contains(logs.String(), want) {
			t.Errorf("logs:\n%s\nwant %q", logs.String(), want)
		}
		if n := e.effectCounts()["m"]; n != 1 {
			t.Errorf("MaxConns %d: %d effects, want 1", tc.maxConns, n)
		}
	}
}

// Start-up reads the server's timeouts and warns when statement_timeout
// would fire before lock_timeout: a lock wait would then be blamed on the
// message.
func TestStatementTimeoutWithoutLowerLockTimeoutWarns(t *testing.T) {
	e := newEnv(t, consumertest.Config{Lanes: 1})
	e.withRoleSettings(map[string]string{"statement_timeout": "2s", "idle_in_transaction_session_timeout": "1s"}, nil)
	e.broker.Publish(0, msg("m", "p"))
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e.runUntilIdle(e.consumer(consumer.Config{Logger: logger}), time.Minute)
	for _, want := range []string{
		"statement_timeout is set and lock_timeout is not lower",
		"IdleTxTimeout raises the server's idle_in_transaction_session_timeout",
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs:\n%s\nwant %q", logs.String(), want)
		}
	}
}
