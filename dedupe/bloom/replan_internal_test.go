package bloom

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

// TestClaimReplansWhenTheClockIsElsewhere: a claim plans which partitions
// to probe before it reads the database clock, from an estimate. Here the
// estimate of process b is a whole slice behind. Process a claims a key in
// the current slice and holds its transaction open; b claims the same key,
// waits for a's lock, and must then find a's marker: had b trusted its
// plan, it would have written its marker to the previous slice without
// probing the current one, and both claims would be new.
func TestClaimReplansWhenTheClockIsElsewhere(t *testing.T) {
	t.Parallel()
	const slice = 2 * time.Second
	cfg := Config{Slice: slice, Retention: 20 * time.Second, PartitionsAhead: 10}
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	newStrategy := func() *Strategy {
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pg.Migrate(ctx, pool, cfg.Schema, s.Migrations()...); err != nil {
			t.Fatal(err)
		}
		if err := s.Maintain(ctx, pool); err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := newStrategy(), newStrategy()
	// The previous slice must have a partition, for b's plan to write to.
	now := time.Now()
	time.Sleep(now.Truncate(slice).Add(slice).Sub(now) + 20*time.Millisecond)
	if err := b.Warm(ctx, pool); err != nil { // b has sealed the previous slice
		t.Fatal(err)
	}
	b.clockOffset.Store(int64(-slice))

	key := []dedupe.Key{{Scope: "x", ID: "skewed", Fingerprint: dedupe.Fingerprint([]byte("p"))}}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	vs, err := a.Claim(ctx, tx, key)
	if err != nil || vs[0] != dedupe.VerdictNew {
		t.Fatalf("first claim: %v %v", vs, err)
	}

	type result struct {
		v   []dedupe.Verdict
		err error
	}
	done := make(chan result, 1)
	go func() {
		var vs []dedupe.Verdict
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			vs, err = b.Claim(ctx, tx, key)
			return err
		})
		done <- result{vs, err}
	}()
	// Wait until b waits for a lock (the gate, or a's marker).
	for waiting := false; !waiting; {
		select {
		case r := <-done:
			t.Fatalf("the second claim did not wait for the first: %v %v", r.v, r.err)
		case <-time.After(10 * time.Millisecond):
		}
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a.Committed(key, vs)
	r := <-done
	if r.err != nil || r.v[0] != dedupe.VerdictDuplicate {
		t.Fatalf("second claim, planned for the previous slice: %v %v, want duplicate", r.v, r.err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+a.parent).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d markers of the key, want 1", n)
	}
	// b has learnt the database clock: its next claim plans right.
	if d := time.Duration(b.clockOffset.Load()); d < -slice/2 || d > slice/2 {
		t.Fatalf("b's estimate of the database clock is still %v off", d)
	}
}

// TestClaimChecksTheBarrierItTrusts: claims take no per-key lock; a claim
// may write to a slice only once a barrier in that slice has waited out
// every claim of an earlier slice, and the claim statement checks that
// against the barrier the database recorded, not against what this
// process believes. Here process a claims a key late in one slice and
// holds its transaction open past the boundary; process b wrongly believes
// a barrier already passed in the new slice and claims the same key. Had b
// trusted its belief, it would have written its marker to the new slice
// (whose index does not hold a's uncommitted marker) without waiting, and
// both claims would be new. It must instead write to a's slice, wait for
// a's marker there, and find it a duplicate.
func TestClaimChecksTheBarrierItTrusts(t *testing.T) {
	t.Parallel()
	const slice = 2 * time.Second
	cfg := Config{Slice: slice, Retention: 20 * time.Second, PartitionsAhead: 10}
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	newStrategy := func() *Strategy {
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pg.Migrate(ctx, pool, cfg.Schema, s.Migrations()...); err != nil {
			t.Fatal(err)
		}
		if err := s.Maintain(ctx, pool); err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := newStrategy(), newStrategy()
	key := []dedupe.Key{{Scope: "x", ID: "across", Fingerprint: dedupe.Fingerprint([]byte("p"))}}

	// Late in a slice, after a barrier in it, a claims the key.
	now := time.Now()
	time.Sleep(now.Truncate(slice).Add(slice).Sub(now) + 20*time.Millisecond)
	if err := a.Warm(ctx, pool); err != nil {
		t.Fatal(err)
	}
	now = time.Now()
	time.Sleep(now.Truncate(slice).Add(slice * 3 / 4).Sub(now))
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	vs, err := a.Claim(ctx, tx, key)
	if err != nil || vs[0] != dedupe.VerdictNew {
		t.Fatalf("first claim: %v %v", vs, err)
	}
	written := a.sliceOf(a.clockEstimate())

	// In the next slice, b believes a barrier passed there; none could,
	// since a's claim is in flight.
	now = time.Now()
	time.Sleep(now.Truncate(slice).Add(slice).Sub(now) + 20*time.Millisecond)
	b.barrierAt.Store(time.Now().UnixMicro())

	type result struct {
		v   []dedupe.Verdict
		err error
	}
	done := make(chan result, 1)
	go func() {
		var vs []dedupe.Verdict
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			vs, err = b.Claim(ctx, tx, key)
			return err
		})
		done <- result{vs, err}
	}()
	// Wait until b waits for a lock (a's uncommitted marker).
	for waiting := false; !waiting; {
		select {
		case r := <-done:
			t.Fatalf("the second claim did not wait for the first: %v %v", r.v, r.err)
		case <-time.After(10 * time.Millisecond):
		}
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a.Committed(key, vs)
	r := <-done
	if r.err != nil || r.v[0] != dedupe.VerdictDuplicate {
		t.Fatalf("second claim, after a barrier it only believed in: %v %v, want duplicate", r.v, r.err)
	}
	var n int
	var at time.Time
	if err := pool.QueryRow(ctx, `SELECT count(*), min(slice) FROM `+a.parent).Scan(&n, &at); err != nil {
		t.Fatal(err)
	}
	if n != 1 || !at.Equal(written) {
		t.Fatalf("%d markers of the key, in slice %v; want 1, in a's slice %v", n, at, written)
	}
}
