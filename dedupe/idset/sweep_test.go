package idset_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
)

// countingDB passes statements to a real pool and records how many rows
// each one affected.
type countingDB struct {
	*pgxpool.Pool // Begin, Query and QueryRow pass through
	mu            sync.Mutex
	rows          []int64
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := c.Pool.Exec(ctx, sql, args...)
	if err == nil {
		c.mu.Lock()
		c.rows = append(c.rows, tag.RowsAffected())
		c.mu.Unlock()
	}
	return tag, err
}

// claimKeys claims ids in scope in one committed transaction.
func claimKeys(t testing.TB, s dedupe.Strategy, pool *pgxpool.Pool, keys []dedupe.Key) []dedupe.Verdict {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	vs, err := s.Claim(ctx, tx, keys)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return vs
}

func keyRange(scope string, from, to int) []dedupe.Key {
	var ks []dedupe.Key
	for i := from; i < to; i++ {
		ks = append(ks, dedupe.Key{Scope: scope, ID: fmt.Sprintf("id-%d", i)})
	}
	return ks
}

func count(vs []dedupe.Verdict, v dedupe.Verdict) int {
	n := 0
	for _, x := range vs {
		if x == v {
			n++
		}
	}
	return n
}

// backdate makes the markers of scope with the given ids look processed age ago.
func backdate(t testing.TB, pool *pgxpool.Pool, table string, keys []dedupe.Key, age time.Duration) {
	t.Helper()
	var ids []string
	for _, k := range keys {
		ids = append(ids, k.ID)
	}
	tag, err := pool.Exec(context.Background(),
		`UPDATE `+table+` SET processed_at = now() - $1::bigint * interval '1 microsecond' WHERE scope = $2 AND id = ANY($3)`,
		age.Microseconds(), keys[0].Scope, ids)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != int64(len(keys)) {
		t.Fatalf("backdated %d markers, want %d", tag.RowsAffected(), len(keys))
	}
}

func markers(t testing.TB, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestSweepDeletesExpiredMarkersInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStrategy(t, idset.Config{Retention: time.Hour, SweepBatch: 10})
	const table = `effectively.processed`

	old, fresh := keyRange("s", 0, 25), keyRange("s", 25, 35)
	claimKeys(t, s, pool, append(append([]dedupe.Key{}, old...), fresh...))
	backdate(t, pool, table, old, 2*time.Hour)
	// Just inside the retention: kept.
	backdate(t, pool, table, fresh[:3], 59*time.Minute)

	db := &countingDB{Pool: pool}
	deleted, err := s.Sweep(ctx, db)
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if deleted != 25 {
		t.Errorf("Sweep deleted %d markers, want 25", deleted)
	}
	if want := []int64{10, 10, 5}; fmt.Sprint(db.rows) != fmt.Sprint(want) {
		t.Errorf("Sweep's statements deleted %v markers, want batches %v", db.rows, want)
	}
	if n := markers(t, pool, table); n != 10 {
		t.Errorf("%d markers left, want the 10 fresh ones", n)
	}
	// Expired keys are new again, fresh ones still duplicates.
	vs := claimKeys(t, s, pool, append(append([]dedupe.Key{}, old...), fresh...))
	if got := count(vs[:25], dedupe.VerdictNew); got != 25 {
		t.Errorf("%d of 25 swept keys new again, want all", got)
	}
	if got := count(vs[25:], dedupe.VerdictDuplicate); got != 10 {
		t.Errorf("%d of 10 fresh keys duplicate, want all", got)
	}

	// Exactly two full batches: one more statement finds nothing.
	backdate(t, pool, table, keyRange("s", 0, 20), 3*time.Hour)
	db.rows = nil
	if deleted, err = s.Sweep(ctx, db); err != nil || deleted != 20 {
		t.Errorf("Sweep = %d, %v; want 20, nil", deleted, err)
	}
	if want := []int64{10, 10, 0}; fmt.Sprint(db.rows) != fmt.Sprint(want) {
		t.Errorf("Sweep's statements deleted %v markers, want %v", db.rows, want)
	}

	// Nothing expired: one statement.
	db.rows = nil
	if deleted, err = s.Sweep(ctx, db); err != nil || deleted != 0 || len(db.rows) != 1 {
		t.Errorf("Sweep with nothing expired = %d, %v after %d statements; want 0, nil after 1", deleted, err, len(db.rows))
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Sweep(cctx, pool); err == nil {
		t.Error("Sweep with a cancelled context succeeded, want an error")
	}
}

func TestRunSweeper(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	s, pool := newStrategy(t, idset.Config{
		Retention: time.Hour, SweepBatch: 7, SweepInterval: 20 * time.Millisecond, Logger: logger,
	})
	const table = `effectively.processed`
	ks := keyRange("s", 0, 30)
	claimKeys(t, s, pool, ks)
	backdate(t, pool, table, ks[:20], 2*time.Hour)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.RunSweeper(ctx, pool) }()

	// Each round logs what it deleted after its last batch committed: wait
	// for that line, the event the test is about, not for the marker count
	// (which is reached before the round has written its line).
	deadline := time.Now().Add(10 * time.Second)
	waitLog := func(want string) {
		t.Helper()
		for !strings.Contains(logs.String(), want) {
			if time.Now().After(deadline) {
				cancel()
				t.Fatalf("RunSweeper did not log %q within 10s (%d markers left):\n%s", want, markers(t, pool, table), logs.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitLog("deleted=20")
	if n := markers(t, pool, table); n != 10 {
		t.Fatalf("RunSweeper left %d markers after its first round, want 10", n)
	}
	// Markers that expire later are swept by a later round.
	backdate(t, pool, table, ks[20:25], 2*time.Hour)
	waitLog("deleted=5")
	if n := markers(t, pool, table); n != 5 {
		t.Fatalf("RunSweeper left %d markers after its second round, want 5", n)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("RunSweeper = %v after cancel, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("RunSweeper did not return after its context was cancelled")
	}
	if out := logs.String(); !strings.Contains(out, "swept expired markers") {
		t.Errorf("RunSweeper's log does not say what it swept:\n%s", out)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger writing in another goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
