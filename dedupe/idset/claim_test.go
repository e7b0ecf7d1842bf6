package idset_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
)

// TestClaimReadsFingerprintCommittedConcurrently: when the marker a claim
// conflicts with was committed by another transaction while the claim
// waited, its fingerprint is still compared (the rare second statement).
func TestClaimReadsFingerprintCommittedConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStrategy(t, idset.Config{})
	fp := func(p string) []byte { return dedupe.Fingerprint([]byte(p)) }
	k := func(id, payload string) dedupe.Key {
		key := dedupe.Key{Scope: "s", ID: id}
		if payload != "" {
			key.Fingerprint = fp(payload)
		}
		return key
	}
	first := []dedupe.Key{k("a", "A"), k("b", "A"), k("c", "")}
	second := []dedupe.Key{k("a", "B"), k("a", "A"), k("b", "A"), k("c", "C"), k("d", "D"), k("b", "B")}
	want := []dedupe.Verdict{dedupe.VerdictMismatch, dedupe.VerdictDuplicate, dedupe.VerdictDuplicate,
		dedupe.VerdictDuplicate, dedupe.VerdictNew, dedupe.VerdictMismatch}

	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx1.Rollback(ctx) }()
	if _, err := s.Claim(ctx, tx1, first); err != nil {
		t.Fatal(err)
	}
	type result struct {
		vs  []dedupe.Verdict
		err error
	}
	done := make(chan result, 1)
	go func() {
		tx2, err := pool.Begin(ctx)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer func() { _ = tx2.Rollback(ctx) }()
		vs, err := s.Claim(ctx, tx2, second)
		if err == nil {
			err = tx2.Commit(ctx)
		}
		done <- result{vs, err}
	}()
	waitForLockWaiter(t, pool)
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("second claim: %v", r.err)
	}
	if !slices.Equal(r.vs, want) {
		t.Errorf("second claim = %v, want %v", r.vs, want)
	}
}

// waitForLockWaiter waits until a session of the pool's database waits on a lock.
func waitForLockWaiter(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no session waited on a lock within 10s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestOppositeOrderBatchesDoNotDeadlock: two large batches of the same keys
// in opposite orders, claimed at once, both succeed: markers are inserted
// in one global order.
func TestOppositeOrderBatchesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStrategy(t, idset.Config{})
	for round := range 5 {
		scope := fmt.Sprintf("round-%d", round)
		up := keyRange(scope, 0, 2000)
		down := slices.Clone(up)
		slices.Reverse(down)
		var wg sync.WaitGroup
		results := make([][]dedupe.Verdict, 2)
		errs := make([]error, 2)
		start := make(chan struct{})
		for i, ks := range [][]dedupe.Key{up, down} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tx, err := pool.Begin(ctx)
				if err != nil {
					errs[i] = err
					return
				}
				defer func() { _ = tx.Rollback(ctx) }()
				<-start
				if results[i], errs[i] = s.Claim(ctx, tx, ks); errs[i] == nil {
					errs[i] = tx.Commit(ctx)
				}
			}()
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: claimer %d: %v", round, i, err)
			}
		}
		if n := count(results[0], dedupe.VerdictNew) + count(results[1], dedupe.VerdictNew); n != len(up) {
			t.Errorf("round %d: %d keys new in all, want %d", round, n, len(up))
		}
	}
}

// TestRepeatableReadConflictFails: under REPEATABLE READ a claim that runs
// into a marker committed after its snapshot cannot see it, so it fails
// with a serialization failure (to be retried) instead of guessing.
func TestRepeatableReadConflictFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newStrategy(t, idset.Config{})
	ks := keyRange("s", 0, 3)

	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx1.Rollback(ctx) }()
	if _, err := s.Claim(ctx, tx1, ks); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		tx2, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			done <- err
			return
		}
		defer func() { _ = tx2.Rollback(ctx) }()
		_, err = s.Claim(ctx, tx2, ks)
		done <- err
	}()
	waitForLockWaiter(t, pool)
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-done
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Errorf("claim under REPEATABLE READ after a concurrent commit = %v, want a serialization failure (40001)", err)
	}
}
