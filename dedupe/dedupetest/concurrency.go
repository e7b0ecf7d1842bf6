package dedupetest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/effectively-once/effectively/dedupe"
)

// rounds is how often each race is run.
const rounds = 50

// testSecondClaimerWaits: a transaction claiming a key that an open
// transaction has claimed waits for it to end, and then sees its outcome:
// a duplicate if it committed, new if it rolled back.
func testSecondClaimerWaits(e *env) {
	ctx := context.Background()
	for _, commit := range []bool{true, false} {
		scope := fmt.Sprintf("wait-commit-%v", commit)
		ks := e.keys(scope, 0, 3)

		tx1, err := e.pool.Begin(ctx)
		if err != nil {
			e.Fatal(err)
		}
		defer func() { _ = tx1.Rollback(ctx) }() // after a failure
		v1, err := e.claimTx(ctx, tx1, ks)
		if err != nil {
			e.Fatalf("first claim: %v", err)
		}
		e.expect("first claim", ks, v1, newV, newV, newV)

		second := e.claimInBackground(ctx, ks)
		defer second.abandon()

		// Wait until the second claim waits on a lock (or returns early,
		// which breaks the contract).
		deadline := time.Now().Add(10 * time.Second)
		for !e.waitingOnLock(ctx) {
			select {
			case r := <-second.result:
				e.Fatalf("a claim of keys claimed by an open transaction returned %v, %v without waiting for it", r.vs, r.err)
			default:
			}
			if time.Now().After(deadline) {
				e.Fatal("the second claim neither returned nor waited on a lock within 10s")
			}
			time.Sleep(2 * time.Millisecond)
		}

		if commit {
			if err := tx1.Commit(ctx); err != nil {
				e.Fatal(err)
			}
			e.committed(ks, v1)
		} else {
			_ = tx1.Rollback(ctx)
		}
		r := <-second.result
		if r.err != nil {
			e.Fatalf("second claim: %v", r.err)
		}
		if commit {
			e.expect("second claim after the first committed", ks, r.vs, dup, dup, dup)
		} else {
			e.expect("second claim after the first rolled back", ks, r.vs, newV, newV, newV)
		}
		if err := second.end(true); err != nil {
			e.Fatal(err)
		}
		e.committed(ks, r.vs)
		e.expect("after both", ks, e.claimRollback(ks), dup, dup, dup)
	}
}

// background is a claim running in a transaction of its own in another
// goroutine.
type background struct {
	result chan claimResult // the claim's outcome
	finish chan bool        // true: commit; false: roll back
	ended  chan error       // the commit's error
}

type claimResult struct {
	vs  []dedupe.Verdict
	err error
}

// claimInBackground begins a transaction and claims keys in it, in another
// goroutine. The transaction stays open until end is called.
func (e *env) claimInBackground(ctx context.Context, keys []dedupe.Key) *background {
	b := &background{result: make(chan claimResult, 1), finish: make(chan bool, 1), ended: make(chan error, 1)}
	go func() {
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			b.result <- claimResult{err: err}
			<-b.finish
			b.ended <- err
			return
		}
		vs, err := e.claimTx(ctx, tx, keys)
		b.result <- claimResult{vs, err}
		if commit := <-b.finish; commit && err == nil {
			b.ended <- tx.Commit(ctx)
			return
		}
		_ = tx.Rollback(ctx)
		b.ended <- nil
	}()
	return b
}

// end commits or rolls back the background transaction and waits for it.
func (b *background) end(commit bool) error {
	b.finish <- commit
	return <-b.ended
}

// abandon rolls the background transaction back unless end was called.
func (b *background) abandon() {
	select {
	case b.finish <- false:
	default:
	}
}

// waitingOnLock reports whether a session of the database waits on a lock.
func (e *env) waitingOnLock(ctx context.Context) bool {
	var n int
	err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
	if err != nil {
		e.Fatalf("pg_stat_activity: %v", err)
	}
	return n > 0
}

// testConcurrentOneKey: two transactions claim one key at the same time,
// and commit or roll back; exactly one committed transaction got it new.
func testConcurrentOneKey(e *env) {
	for r := range rounds {
		scope := fmt.Sprintf("one-%d", r)
		k := e.keys(scope, 0, 1)
		e.race(scope, r, k, k)
	}
}

// testConcurrentOverlappingBatches: two transactions claim batches that
// share a prefix; each shared key is new in exactly one committed
// transaction, and the others are new where they are claimed.
func testConcurrentOverlapping(e *env) {
	for r := range rounds {
		scope := fmt.Sprintf("overlap-%d", r)
		a, b := e.keys(scope, 0, 3), e.keys(scope, 0, 5)
		if r%2 == 1 {
			a, b = b, a
		}
		e.race(scope, r, a, b)
	}
}

// claimer is one side of a race.
type claimer struct {
	keys   []dedupe.Key
	commit bool
	vs     []dedupe.Verdict
	err    error
}

// race claims a and b in two concurrent transactions that start their
// claims together, ends them as round picks (both commit, one of them rolls
// back, or both do), and checks the outcome.
func (e *env) race(scope string, round int, a, b []dedupe.Key) {
	e.Helper()
	ctx := context.Background()
	sides := []*claimer{
		{keys: a, commit: round%4 != 1 && round%4 != 3},
		{keys: b, commit: round%4 != 2 && round%4 != 3},
	}
	var ready, finished sync.WaitGroup
	start := make(chan struct{})
	for _, c := range sides {
		ready.Add(1)
		finished.Add(1)
		go func() {
			defer finished.Done()
			tx, err := e.pool.Begin(ctx)
			ready.Done()
			if err != nil {
				c.err = err
				return
			}
			defer func() { _ = tx.Rollback(ctx) }()
			<-start
			c.vs, c.err = e.claimTx(ctx, tx, c.keys)
			if c.err != nil {
				return
			}
			time.Sleep(time.Millisecond) // hold the claim so the other side runs into it
			if c.commit {
				if c.err = tx.Commit(ctx); c.err == nil {
					e.committed(c.keys, c.vs)
				}
			}
		}()
	}
	ready.Wait()
	close(start)
	finished.Wait()
	for i, c := range sides {
		if c.err != nil {
			e.Fatalf("round %d: claimer %d: %v", round, i, c.err)
		}
	}

	// Every key: new in exactly one committed transaction if any committed
	// transaction claimed it, and new wherever only one side claimed it.
	claimed := map[string]dedupe.Key{}
	newIn := map[string]int{}
	inCommitted := map[string]bool{}
	for _, c := range sides {
		for j, k := range c.keys {
			id := k.String()
			claimed[id] = k
			if c.commit {
				inCommitted[id] = true
				if c.vs[j] == newV {
					newIn[id]++
				}
			}
		}
	}
	var final []dedupe.Key
	var want []dedupe.Verdict
	for _, k := range e.keys(scope, 0, len(claimed)) {
		id := k.String()
		if _, ok := claimed[id]; !ok {
			e.Fatalf("round %d: key %s not claimed (Harness.Key must give distinct keys)", round, id)
		}
		switch {
		case inCommitted[id] && newIn[id] != 1:
			e.Errorf("round %d: key %s was new in %d committed transactions, want exactly 1 (a: %v %v commit=%v, b: %v %v commit=%v)",
				round, id, newIn[id], describe(a), sides[0].vs, sides[0].commit, describe(b), sides[1].vs, sides[1].commit)
		case !inCommitted[id] && newIn[id] != 0:
			e.Errorf("round %d: key %s is new in a transaction that rolled back", round, id)
		}
		final = append(final, k)
		if inCommitted[id] {
			want = append(want, dup)
		} else {
			want = append(want, newV)
		}
	}
	for i, c := range sides {
		other := sides[1-i]
		for j, k := range c.keys {
			if !contains(other.keys, k) && c.vs[j] != newV {
				e.Errorf("round %d: key %s, claimed only by claimer %d, got %v, want new", round, k, i, c.vs[j])
			}
		}
	}
	e.expect(fmt.Sprintf("round %d: claim after the race", round), final, e.claimRollback(final), want...)
}

func contains(ks []dedupe.Key, k dedupe.Key) bool {
	for _, x := range ks {
		if x.String() == k.String() {
			return true
		}
	}
	return false
}
