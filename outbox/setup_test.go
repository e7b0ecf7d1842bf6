package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// setup returns a pool on a fresh database with the outbox migrated.
func setup(t *testing.T, cfg Config) (*pgxpool.Pool, *Outbox) {
	t.Helper()
	pool := pgtest.NewPool(t)
	o, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Migrate(context.Background(), pool, cfg.Schema, o.Line()); err != nil {
		t.Fatal(err)
	}
	return pool, o
}

// emit emits msgs in a transaction of its own and commits it.
func emit(t *testing.T, db *pgxpool.Pool, o *Outbox, msgs ...Message) {
	t.Helper()
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return o.Emit(ctx, tx, msgs...) }); err != nil {
		t.Fatal(err)
	}
}

// memSink is a Sink that keeps what it is given, in order. It is a real
// implementation of the interface, for the relay's own logic; the Kafka
// sink is tested against kfake.
type memSink struct {
	mu        sync.Mutex
	got       []Message
	changed   chan struct{}    // closed and replaced on every publish
	refuse    map[string]error // by ID: the error Publish reports for it
	failTimes map[string]int   // by ID: how many more times it fails transiently
}

func newMemSink() *memSink {
	return &memSink{changed: make(chan struct{}), refuse: map[string]error{}, failTimes: map[string]int{}}
}

func (s *memSink) Publish(ctx context.Context, msgs []Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	errs := PublishErrors{}
	failedKey := map[string]bool{}
	for i, m := range msgs {
		if failedKey[m.Sink+"\x00"+string(m.Key)] && m.Key != nil {
			errs[i] = errors.New("behind a failure of its key")
			continue
		}
		if err := s.refuse[m.ID]; err != nil {
			errs[i] = err
		} else if s.failTimes[m.ID] > 0 {
			s.failTimes[m.ID]--
			errs[i] = fmt.Errorf("transient failure of %s", m.ID)
		} else {
			s.got = append(s.got, m)
			continue
		}
		failedKey[m.Sink+"\x00"+string(m.Key)] = true
	}
	close(s.changed)
	s.changed = make(chan struct{})
	if len(errs) > 0 {
		return errs
	}
	return nil
}

func (s *memSink) messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.got...)
}

// waitFor waits until cond holds for what the sink got, failing t after timeout.
func (s *memSink) waitFor(t *testing.T, timeout time.Duration, what string, cond func([]Message) bool) []Message {
	t.Helper()
	deadline := time.After(timeout)
	for {
		s.mu.Lock()
		got := append([]Message(nil), s.got...)
		ch := s.changed
		s.mu.Unlock()
		if cond(got) {
			return got
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s; the sink got %d messages", what, len(got))
		}
	}
}

func hasIDs(ids ...string) func([]Message) bool {
	return func(got []Message) bool {
		seen := map[string]bool{}
		for _, m := range got {
			seen[m.ID] = true
		}
		for _, id := range ids {
			if !seen[id] {
				return false
			}
		}
		return true
	}
}

func ids(ms []Message) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.ID)
	}
	return out
}

// firstOrder returns, per key, the IDs in order of their first delivery.
func firstOrder(ms []Message) map[string][]string {
	seen := map[string]bool{}
	out := map[string][]string{}
	for _, m := range ms {
		if seen[m.ID] {
			continue
		}
		seen[m.ID] = true
		out[string(m.Key)] = append(out[string(m.Key)], m.ID)
	}
	return out
}

// running is a relay's Run in a goroutine.
type running struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned err
	err    error
}

func startRelay(t *testing.T, db *pgxpool.Pool, cfg RelayConfig) (*Relay, *running) {
	t.Helper()
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 2 * time.Second
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 200 * time.Millisecond
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = 10 * time.Millisecond
		cfg.MaxBackoff = 50 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = consumertest.Logger()
	}
	r, err := NewRelay(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{cancel: cancel, done: make(chan struct{})}
	go func() { run.err = r.Run(ctx); close(run.done) }()
	t.Cleanup(func() { cancel(); <-run.done })
	return r, run
}

// stop cancels the relay and returns Run's error.
func (r *running) stop() error {
	r.cancel()
	<-r.done
	return r.err
}

// waitRows polls the database until query returns want, a guard against a
// hung test rather than a timing assertion.
func waitRows(t *testing.T, db *pgxpool.Pool, timeout time.Duration, want int, query string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var n int
		if err := db.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s gave %d, want %d", query, n, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var _ = bytes.Equal

type txLike = pgx.Tx

func pgxBegin(ctx context.Context, db *pgxpool.Pool, f func(context.Context, pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return f(ctx, tx) })
}

// waitAtLeast polls until query returns at least want.
func waitAtLeast(t *testing.T, db *pgxpool.Pool, timeout time.Duration, want int, query string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var n int
		if err := db.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s gave %d, want at least %d", query, n, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitUntil polls cond, which reads in-memory state, until it holds.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// emitted returns the messages the outbox holds, oldest first: its
// messages table's rows, then the messages of its log table's rows
// (LogMode emits).
func emitted(t *testing.T, db *pgxpool.Pool) []Message {
	t.Helper()
	ctx := context.Background()
	var out []Message
	rows, err := db.Query(ctx, `SELECT sink, key, msg_id, value FROM effectively.outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var m Message
		if err := rows.Scan(&m.Sink, &m.Key, &m.ID, &m.Value); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows, err = db.Query(ctx, `SELECT id, body FROM effectively.outbox_log ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var body []byte
		if err := rows.Scan(&id, &body); err != nil {
			t.Fatal(err)
		}
		xs, err := decodeLogBody(id, time.Time{}, body)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range xs {
			out = append(out, x.msg)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
