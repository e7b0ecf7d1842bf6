package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// setupBouncer is setup on a database reached through PgBouncer in
// transaction pooling mode, with the pool's statements run in mode.
func setupBouncer(t *testing.T, mode pgx.QueryExecMode) (*pgxpool.Pool, *Outbox) {
	t.Helper()
	pool := pgtest.NewBouncerPool(t, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
	o, err := New(Config{Mode: TableMode})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Migrate(context.Background(), pool, "", o.Line()); err != nil {
		t.Fatal(err)
	}
	return pool, o
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// emitMany emits n messages over keys, each in a transaction of its own,
// from several goroutines at once, and returns their IDs by key in commit
// order.
func emitMany(t *testing.T, db *pgxpool.Pool, o *Outbox, keys, n int) map[string][]string {
	t.Helper()
	var mu sync.Mutex
	order := map[string][]string{}
	var wg sync.WaitGroup
	errs := make(chan error, keys)
	for k := range keys {
		wg.Go(func() {
			key := fmt.Sprintf("k%d", k)
			for i := range n / keys {
				id := fmt.Sprintf("%s-%d", key, i)
				if err := pgx.BeginFunc(context.Background(), db, func(tx pgx.Tx) error { return o.Emit(context.Background(), tx, msg(key, id)) }); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				order[key] = append(order[key], id)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return order
}

// checkPublished checks that every emitted ID was published, in commit
// order per key, and that the outbox has no row left to publish.
func checkPublished(t *testing.T, db *pgxpool.Pool, sink *memSink, order map[string][]string) {
	t.Helper()
	var all []string
	for _, ids := range order {
		all = append(all, ids...)
	}
	got := sink.waitFor(t, time.Minute, fmt.Sprintf("all %d messages", len(all)), hasIDs(all...))
	first := firstOrder(got)
	for key, ids := range order {
		if strings.Join(first[key], ",") != strings.Join(ids, ",") {
			t.Errorf("key %s published as %v, want %v", key, first[key], ids)
		}
	}
	// The marks are written after the publish; wait for them too.
	deadline := time.Now().Add(time.Minute)
	for {
		var left int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM effectively.outbox WHERE published_at IS NULL`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still unmarked", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The relay in PollOnly mode through PgBouncer in transaction pooling
// publishes every committed row, in commit order per key, and marks it.
func TestRelayPollOnlyThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeCacheDescribe} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db, o := setupBouncer(t, mode)
			sink := newMemSink()
			startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, PollOnly: true, PollInterval: 20 * time.Millisecond,
				onListen: func() { t.Error("a poll-only relay listened") }})
			checkPublished(t, db, sink, emitMany(t, db, o, 4, 200))
		})
	}
}

// Without PollOnly, the relay finds the transaction pooler at start-up,
// says that LISTEN cannot work through it and how to say PollOnly, never
// LISTENs, and publishes by polling.
func TestRelayFindsTransactionPoolingAndPolls(t *testing.T) {
	t.Parallel()
	db, o := setupBouncer(t, pgx.QueryExecModeExec)
	sink := newMemSink()
	var logs syncBuffer
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, PollInterval: 20 * time.Millisecond,
		Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
		onListen: func() { t.Error("the relay LISTENed through a transaction pooler") }})
	// The check at start-up shares the pooler's server connections with
	// whatever else runs; the emits wait for its verdict, so that they
	// cannot take the connection its probe looks for.
	waitUntil(t, 2*time.Minute, "the relay's start-up check", func() bool {
		return strings.Contains(logs.String(), "LISTEN cannot work") || strings.Contains(logs.String(), "pooler")
	})
	checkPublished(t, db, sink, emitMany(t, db, o, 2, 40))
	if l := logs.String(); !strings.Contains(l, "LISTEN cannot work") || !strings.Contains(l, "PollOnly") {
		t.Errorf("no start-up warning naming PollOnly; the relay logged:\n%s", l)
	}
}

// A relay whose pool keeps named prepared statements (pgx's default) is
// refused at start-up behind a transaction pooler, PollOnly or not.
func TestRelayRefusesCachedStatementsThroughPgBouncer(t *testing.T) {
	t.Parallel()
	url := pgtest.BouncerURL(t)
	direct, err := pgxpool.New(context.Background(), url+"&default_query_exec_mode=exec")
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	o, err := New(Config{Mode: TableMode})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Migrate(context.Background(), direct, "", o.Line()); err != nil {
		t.Fatal(err)
	}
	db, err := pgxpool.New(context.Background(), url) // pgx's default: cached statements
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, pollOnly := range []bool{false, true} {
		r, err := NewRelay(db, RelayConfig{Sinks: map[string]Sink{"s": newMemSink()}, PollOnly: pollOnly})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = r.Run(ctx)
		cancel()
		if !errors.Is(err, pg.ErrTransactionPooling) {
			t.Errorf("PollOnly %v: Run returned %v; want ErrTransactionPooling", pollOnly, err)
		}
	}
}
