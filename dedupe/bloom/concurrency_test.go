package bloom_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
)

// TestConcurrentClaimersFiltersDiffer runs two strategies on one table, as
// two consumer processes would, with one-second slices so that claims cross
// slice boundaries and seals happen while they run. Strategy a has seen
// half the keys before (its filters hold them), b has not. Every key is
// claimed at once by both, in overlapping batches in opposite orders:
// exactly one claim of each key may be new.
func TestConcurrentClaimersFiltersDiffer(t *testing.T) {
	t.Parallel()
	cfg := bloom.Config{Slice: time.Second, Retention: 20 * time.Second}
	a, pool := setup(t, cfg)
	b := open(t, pool, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var maint sync.WaitGroup
	maint.Go(func() { _ = a.RunMaintenance(ctx, pool) })
	maint.Go(func() { _ = b.RunMaintenance(ctx, pool) })
	defer func() { cancel(); maint.Wait() }()

	// a has claimed the even keys of an earlier run; b knows nothing.
	const n, batch = 1200, 40
	var seen []dedupe.Key
	for i := 0; i < n; i += 2 {
		seen = append(seen, keyOf("c", i))
	}
	claimAll(t, a, pool, seen, 100)

	all := keyRange("c", 0, n)
	reversed := make([]dedupe.Key, n)
	for i, k := range all {
		reversed[n-1-i] = k
	}
	news := make([]int, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	run := func(s *bloom.Strategy, keys []dedupe.Key) {
		for len(keys) > 0 {
			ks := keys[:min(batch, len(keys))]
			keys = keys[len(ks):]
			var vs []dedupe.Verdict
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				var err error
				vs, err = s.Claim(ctx, tx, ks)
				return err
			})
			if err != nil {
				t.Error(err)
				return
			}
			s.Committed(ks, vs)
			mu.Lock()
			for i, v := range vs {
				var idx int
				fmt.Sscanf(ks[i].ID, "msg-%d", &idx)
				if v == dedupe.VerdictNew {
					news[idx]++
				}
			}
			mu.Unlock()
			time.Sleep(40 * time.Millisecond) // spread the run over slice boundaries
		}
	}
	begin := time.Now()
	wg.Go(func() { run(a, all) })
	wg.Go(func() { run(b, reversed) })
	wg.Go(func() { run(b, all) })
	wg.Go(func() { run(a, reversed) })
	wg.Wait()
	if took := time.Since(begin); took < time.Second {
		t.Fatalf("the claims took %v, less than a slice: no boundary was crossed", took)
	}
	for i, c := range news {
		want := 1
		if i%2 == 0 {
			want = 0 // claimed before
		}
		if c != want {
			t.Errorf("key %d: %d claims were new, want %d", i, c, want)
		}
	}
	if n := markers(t, pool, bloom.DefaultTable); n != 1200 {
		t.Errorf("%d markers, want 1200", n)
	}
}

// TestBoundaryRule holds a claim of a key open across a slice boundary
// while a second strategy, whose filters never saw the key, claims it in
// the next slice: the second claim waits for the first and is a duplicate,
// although the two markers would live in different partitions.
func TestBoundaryRule(t *testing.T) {
	t.Parallel()
	cfg := bloom.Config{Slice: time.Second, Retention: 10 * time.Second, PartitionsAhead: 5}
	a, pool := setup(t, cfg)
	b := open(t, pool, cfg)
	ctx := context.Background()
	if err := b.Warm(ctx, pool); err != nil {
		t.Fatal(err)
	}
	key := []dedupe.Key{{Scope: "x", ID: "boundary", Fingerprint: dedupe.Fingerprint([]byte("p"))}}

	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(800 * time.Millisecond)))
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	vs, err := a.Claim(ctx, tx, key)
	if err != nil || vs[0] != dedupe.VerdictNew {
		t.Fatalf("first claim: %v %v", vs, err)
	}
	waitForNextSlice(time.Second)

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
	select {
	case r := <-done:
		t.Fatalf("the second claim did not wait for the first: %v %v", r.v, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a.Committed(key, vs)
	r := <-done
	if r.err != nil || r.v[0] != dedupe.VerdictDuplicate {
		t.Fatalf("second claim across the boundary: %v %v, want duplicate", r.v, r.err)
	}
	if err := b.Maintain(ctx, pool); err != nil {
		t.Fatal(err)
	}
	// b's sealed filter of the first slice, built after the claim
	// committed, knows the key without a probe into the current slice.
	if got := claim(t, b, pool, key); got[0] != dedupe.VerdictDuplicate {
		t.Fatalf("after the seal: %v, want duplicate", got)
	}
	if st := b.Stats(); st.ConfirmedPositives == 0 {
		t.Fatalf("the sealed filter did not hold the key: %+v", st)
	}
}

// TestSealWaitsForOpenClaims: a claim writes a key into a slice and stays
// open past the slice's end while another process seals that slice. The
// seal must wait for the claim, or the sealed filter would lack the key and
// the other process would apply its redelivery as new.
func TestSealWaitsForOpenClaims(t *testing.T) {
	t.Parallel()
	cfg := bloom.Config{Slice: time.Second, Retention: 10 * time.Second, PartitionsAhead: 5}
	a, pool := setup(t, cfg)
	b := open(t, pool, cfg)
	ctx := context.Background()
	key := keyRange("s", 0, 1)

	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(800 * time.Millisecond)))
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	vs, err := a.Claim(ctx, tx, key)
	if err != nil || vs[0] != dedupe.VerdictNew {
		t.Fatalf("first claim: %v %v", vs, err)
	}
	waitForNextSlice(time.Second)
	sealed := make(chan error, 1)
	go func() { sealed <- b.Warm(ctx, pool) }()
	select {
	case err := <-sealed:
		t.Fatalf("the seal did not wait for the open claim (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-sealed; err != nil {
		t.Fatal(err)
	}
	if got := claim(t, b, pool, key); got[0] != dedupe.VerdictDuplicate {
		t.Fatalf("redelivery to the other process: %v, want duplicate", got)
	}
	if st := b.Stats(); st.ConfirmedPositives != 1 {
		t.Fatalf("the sealed filter did not hold the key: %+v", st)
	}
}

// TestOppositeOrderBatchesDoNotDeadlock: two large batches of the same keys
// in opposite orders, claimed at once, both succeed and claim each key new
// once: the markers are inserted in one global order, so neither claim can
// hold a key the other waits for while it waits for one the other holds.
func TestOppositeOrderBatchesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	s, pool := setup(t, bloom.Config{})
	ctx := context.Background()
	for round := range 5 {
		up := keyRange(fmt.Sprintf("round-%d", round), 0, 2000)
		down := slices.Clone(up)
		slices.Reverse(down)
		var wg sync.WaitGroup
		results := make([][]dedupe.Verdict, 2)
		errs := make([]error, 2)
		start := make(chan struct{})
		for i, ks := range [][]dedupe.Key{up, down} {
			wg.Go(func() {
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
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: claimer %d: %v", round, i, err)
			}
		}
		news := 0
		for _, vs := range results {
			for _, v := range vs {
				if v == dedupe.VerdictNew {
					news++
				}
			}
		}
		if news != len(up) {
			t.Errorf("round %d: %d keys new in all, want %d", round, news, len(up))
		}
	}
}
