package dedupetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/effectively-once/effectively/dedupe"
)

// The checks of the optional interfaces listed in package dedupe's
// documentation: each subtest finds its interface by type assertion, as
// consumer.New does, and skips when the strategy does not implement it.
// This file holds the interfaces that answer questions (KeyChecker,
// Sequencer, Committer, Retainer); upkeep.go those that touch the store
// (Migrator, Maintainer, Warmer).

// capability returns the strategy as a T, skipping the test when it is not
// one.
func capability[T any](e *env, iface string) T {
	e.Helper()
	c, ok := e.s.(T)
	if !ok {
		e.Skipf("%s does not implement dedupe.%s", e.s.Name(), iface)
	}
	return c
}

// claimErr claims keys in a transaction of its own, rolls it back, and
// returns Claim's error.
func (e *env) claimErr(keys []dedupe.Key) error {
	e.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		e.Fatalf("begin: %v", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = e.claimTx(ctx, tx, keys)
	return err
}

// badKey is a key some strategy cannot store.
type badKey struct {
	what string
	key  dedupe.Key
}

// badKeys returns variants of the valid key k that a strategy may refuse.
func badKeys(k dedupe.Key) []badKey {
	long := strings.Repeat("x", 1<<16)
	with := func(f func(*dedupe.Key)) dedupe.Key { c := k; f(&c); return c }
	return []badKey{
		{"the zero key", dedupe.Key{}},
		{"a key with only a scope", dedupe.Key{Scope: k.Scope}},
		{"an empty scope", with(func(c *dedupe.Key) { c.Scope = "" })},
		{"a scope that is not UTF-8", with(func(c *dedupe.Key) { c.Scope += "\xff" })},
		{"a NUL byte in the id", with(func(c *dedupe.Key) { c.ID += "\x00" })},
		{"a NUL byte in the sender", with(func(c *dedupe.Key) { c.Sender += "\x00" })},
		{"a 64 KiB id", with(func(c *dedupe.Key) { c.ID = long })},
		{"a 64 KiB sender", with(func(c *dedupe.Key) { c.Sender = long })},
		{"a negative sequence number", with(func(c *dedupe.Key) { c.Seq = -1 })},
	}
}

// testKeyChecker: CheckKey accepts the harness's keys; it refuses with a
// *dedupe.KeyError, and a key it refuses is refused by Claim too (matching
// dedupe.ErrInvalidKey), alone or in a batch; and a key Claim cannot store
// is one CheckKey refuses, so that the consumer parks its message instead
// of failing the batch.
func testKeyChecker(e *env) {
	kc := capability[dedupe.KeyChecker](e, "KeyChecker")
	for i := range 5 {
		for _, k := range []dedupe.Key{e.key("check", i), e.fpKey("check", i, "A")} {
			if err := kc.CheckKey(k); err != nil {
				e.Errorf("CheckKey(%s) refuses a key of the harness: %v", k, err)
			}
		}
	}
	good := e.key("check", 0)
	refused := 0
	for _, b := range badKeys(e.key("check", 0)) {
		checkErr := kc.CheckKey(b.key)
		claimErr := e.claimErr([]dedupe.Key{b.key})
		if checkErr == nil {
			if claimErr != nil {
				e.Errorf("CheckKey accepts %s (%q), but Claim fails on it: %v", b.what, b.key.String(), claimErr)
			}
			continue
		}
		refused++
		var ke *dedupe.KeyError
		if !errors.As(checkErr, &ke) || !errors.Is(checkErr, dedupe.ErrInvalidKey) {
			e.Errorf("CheckKey refuses %s with %T %v, want a *dedupe.KeyError", b.what, checkErr, checkErr)
		}
		if !errors.Is(claimErr, dedupe.ErrInvalidKey) {
			e.Errorf("CheckKey refuses %s, but Claim of it alone returns %v, want an error matching dedupe.ErrInvalidKey", b.what, claimErr)
		}
		if err := e.claimErr([]dedupe.Key{good, b.key}); !errors.Is(err, dedupe.ErrInvalidKey) {
			e.Errorf("CheckKey refuses %s, but Claim of it after a good key returns %v, want an error matching dedupe.ErrInvalidKey", b.what, err)
		}
	}
	e.Logf("CheckKey refuses %d of %d malformed keys", refused, len(badKeys(good)))
	ks := e.keys("check", 0, 5)
	e.expect("good keys after the refused claims", ks, e.claim(ks), all(newV, len(ks))...)
}

// testSequencer: Sequenced gives the same answer on every call, before and
// after claims (the consumer asks once). When it says false, a later key
// claimed first never makes an earlier one a duplicate: the consumer would
// not hold the later message back, and the earlier one would be lost.
func testSequencer(e *env) {
	sq := capability[dedupe.Sequencer](e, "Sequencer")
	first := sq.Sequenced()
	stable := func(when string) {
		for range 100 {
			if got := sq.Sequenced(); got != first {
				e.Errorf("Sequenced() %s returned %v, then %v", when, first, got)
				return
			}
		}
	}
	stable("before any claim")
	later := e.pick("order", 1)
	e.claim(later)
	earlier := e.pick("order", 0)
	v := e.claim(earlier)
	if !first && (len(v) != 1 || v[0] != newV) {
		e.Errorf("Sequenced() is false, but after key 1 was claimed first, Claim(%s) = %v, want [new]: "+
			"the consumer does not hold a sender's later messages back, so key 0's message would be lost",
			describe(earlier), verdictList(v))
	}
	stable("after claims")
}

// testCommitter: the verdicts of committed claims, reported through
// Committed (with repeats, mismatches and several scopes in one batch),
// keep later verdicts right; a rolled-back claim, never reported, leaves
// its keys new; a commit that is never reported (another process's, or a
// report still on its way) is seen all the same; and Committed runs
// safely alongside claims.
func testCommitter(e *env) {
	capability[dedupe.Committer](e, "Committer")

	ks := []dedupe.Key{e.fpKey("a", 0, "A"), e.fpKey("a", 1, "A"), e.key("b", 0), e.fpKey("a", 0, "A"), e.fpKey("a", 0, "B")}
	e.expect("first claim", ks, e.claim(ks), newV, newV, newV, dup, e.reused())
	e.expect("after it was reported", ks, e.claim(ks), dup, dup, dup, dup, e.reused())
	ks = append(e.keys("a", 0, 3), e.key("b", 1))
	e.expect("old and new keys", ks, e.claim(ks), dup, dup, newV, newV)

	e.claim(e.keys("rb", 0, 3))
	rb := e.keys("rb", 3, 6)
	e.expect("claim, rolled back and not reported", rb, e.claimRollback(rb), all(newV, len(rb))...)
	ks = e.keys("rb", 0, 8)
	e.expect("after the rolled-back claim", ks, e.claim(ks), append(all(dup, 3), all(newV, 5)...)...)

	e.claim(e.keys("other", 0, 2))
	unreported := e.keys("other", 2, 6)
	e.expect("claim, committed and never reported", unreported, e.claimUnreported(unreported), all(newV, 4)...)
	ks = e.keys("other", 0, 8)
	e.expect("after an unreported commit", ks, e.claim(ks), append(all(dup, 6), all(newV, 2)...)...)

	e.committersInParallel()
}

// claimUnreported claims keys in a transaction of its own and commits it
// without calling Committed, as another process sharing the store would.
func (e *env) claimUnreported(keys []dedupe.Key) []dedupe.Verdict {
	e.Helper()
	return e.claimCommit(keys, true, false)
}

// committersInParallel claims and reports in several goroutines at once,
// each in a scope of its own, checking every verdict (with -race, it also
// checks that Committed and Claim share their state safely).
func (e *env) committersInParallel() {
	const workers, batches, size = 4, 10, 5
	var wg sync.WaitGroup
	for w := range workers {
		scope := fmt.Sprintf("parallel-%d", w)
		wg.Go(func() {
			ctx := context.Background()
			for b := range batches {
				// The previous batch again, then the next one.
				ks := e.keys(scope, max(0, b-1)*size, (b+1)*size)
				want := append(all(dup, len(ks)-size), all(newV, size)...)
				tx, err := e.pool.Begin(ctx)
				if err != nil {
					e.Errorf("begin: %v", err)
					return
				}
				vs, err := e.claimTx(ctx, tx, ks)
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					_ = tx.Rollback(ctx)
					e.Errorf("%s: Claim and commit: %v", scope, err)
					return
				}
				e.committed(ks, vs)
				if fmt.Sprint(vs) != fmt.Sprint(want) {
					e.Errorf("claims in parallel: Claim(%s)\n got  %v\n want %v", describe(ks), verdictList(vs), verdictList(want))
					return
				}
			}
		})
	}
	wg.Wait()
}

// testRetainer: Retention is positive (the markers expire, or the strategy
// would not be a Retainer) and the same on every call; and when the
// strategy is also an Inspector, SweepExpired agrees: it sweeps (no
// dedupe.ErrNoSweep) at that same retention.
func testRetainer(e *env) {
	r := capability[dedupe.Retainer](e, "Retainer")
	d := r.Retention()
	if d <= 0 {
		e.Errorf("Retention() = %v; a Retainer's markers expire, so it must be positive", d)
	}
	if again := r.Retention(); again != d {
		e.Errorf("Retention() returned %v, then %v", d, again)
	}
	insp, ok := e.s.(dedupe.Inspector)
	if !ok {
		return
	}
	rep, err := insp.SweepExpired(context.Background(), e.pool, true)
	switch {
	case errors.Is(err, dedupe.ErrNoSweep):
		e.Errorf("Retention() = %v, but SweepExpired says the markers do not expire", d)
	case err != nil:
		e.Fatalf("SweepExpired (dry run): %v", err)
	case rep.Retention != d:
		e.Errorf("SweepExpired (dry run) reports a retention of %v, Retention() %v", rep.Retention, d)
	}
}
