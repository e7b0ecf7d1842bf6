package dedupetest

import (
	"context"

	"github.com/effectively-once/effectively/dedupe"
)

const (
	newV = dedupe.VerdictNew
	dup  = dedupe.VerdictDuplicate
	mis  = dedupe.VerdictMismatch
)

// testNewThenDuplicate: a committed claim makes every key a duplicate.
func testNewThenDuplicate(e *env) {
	ks := e.keys("s", 0, 100)
	e.expect("first claim", ks, e.claim(ks), all(newV, len(ks))...)
	e.expect("second claim", ks, e.claim(ks), all(dup, len(ks))...)
	e.expect("third claim", ks, e.claim(ks), all(dup, len(ks))...)
}

// testMixedBatchInOrder: verdicts come back in the order of the keys, for a
// batch that interleaves old and new keys.
func testMixedBatchInOrder(e *env) {
	e.claim(e.keys("s", 0, 10))
	ks := e.pick("s", 10, 0, 11, 1, 12, 5, 13, 9)
	e.expect("mixed batch", ks, e.claim(ks), newV, dup, newV, dup, newV, dup, newV, dup)
	e.expect("same batch again", ks, e.claim(ks), all(dup, len(ks))...)
	ks = e.pick("s", 14, 15, 3)
	e.expect("new keys first", ks, e.claim(ks), newV, newV, dup)
}

// testRepeatedKeysInBatch: the first occurrence of a key decides, repeats
// are duplicates, or mismatches when their fingerprint differs.
func testRepeatedKeysInBatch(e *env) {
	e.claim(e.keys("s", 0, 3))
	ks := e.pick("s", 3, 0, 3, 4, 1, 4, 3)
	e.expect("repeats", ks, e.claim(ks), newV, dup, dup, newV, dup, dup, dup)

	ks = []dedupe.Key{
		e.fpKey("f", 0, "A"), e.fpKey("f", 0, "A"), e.fpKey("f", 0, "B"), e.key("f", 0),
		e.key("f", 1), e.fpKey("f", 1, "B"),
	}
	e.expect("repeats with fingerprints", ks, e.claim(ks), newV, dup, e.reused(), dup, newV, dup)
	ks = []dedupe.Key{e.fpKey("f", 0, "A"), e.fpKey("f", 0, "B"), e.fpKey("f", 1, "C")}
	e.expect("after commit, the first occurrence's fingerprint is stored", ks, e.claim(ks), dup, e.reused(), dup)

	// A rolled-back batch with repeats leaves nothing behind.
	ks = e.pick("r", 0, 0, 1, 0)
	e.expect("repeats, rolled back", ks, e.claimRollback(ks), newV, dup, newV, dup)
	e.expect("repeats, again", ks, e.claim(ks), newV, dup, newV, dup)
}

// testMismatchAgainstCommittedMarker: a key reused with another payload is
// a mismatch (or, for strategies without fingerprints, a duplicate), never
// new, and does not replace the stored fingerprint.
func testMismatchAgainstCommittedMarker(e *env) {
	ks := []dedupe.Key{e.fpKey("s", 0, "A"), e.fpKey("s", 1, "A"), e.key("s", 2)}
	e.expect("first claim", ks, e.claim(ks), newV, newV, newV)

	ks = []dedupe.Key{e.fpKey("s", 0, "B")}
	e.expect("other payload", ks, e.claim(ks), e.reused())
	ks = []dedupe.Key{e.fpKey("s", 0, "A")}
	e.expect("same payload after a mismatch", ks, e.claim(ks), dup)
	ks = []dedupe.Key{e.fpKey("s", 0, "B")}
	e.expect("other payload again", ks, e.claim(ks), e.reused())

	ks = []dedupe.Key{e.fpKey("s", 0, "C"), e.fpKey("s", 1, "A"), e.fpKey("s", 3, "C"), e.fpKey("s", 2, "C")}
	e.expect("mixed batch", ks, e.claim(ks), e.reused(), dup, newV, dup)
	ks = []dedupe.Key{e.fpKey("s", 3, "D")}
	e.expect("key made new by a fingerprinted batch", ks, e.claim(ks), e.reused())
}

// testMissingFingerprint: a fingerprint missing on either side cannot prove
// a mismatch.
func testMissingFingerprint(e *env) {
	ks := []dedupe.Key{e.fpKey("s", 0, "A"), e.key("s", 1)}
	e.expect("first claim", ks, e.claim(ks), newV, newV)
	empty := e.key("s", 0)
	empty.Fingerprint = []byte{}
	ks = []dedupe.Key{e.key("s", 0), e.fpKey("s", 1, "B"), e.key("s", 1), empty}
	e.expect("against committed markers", ks, e.claim(ks), dup, dup, dup, dup)
	ks = []dedupe.Key{e.fpKey("s", 2, "A"), e.key("s", 2), e.key("s", 3), e.fpKey("s", 3, "B")}
	e.expect("within a batch", ks, e.claim(ks), newV, dup, newV, dup)
}

// testRollbackLeavesNoMarker: a claim whose transaction rolls back leaves no
// trace, so the message is new when it comes again.
func testRollbackLeavesNoMarker(e *env) {
	ks := e.keys("s", 0, 10)
	e.expect("claim, rolled back", ks, e.claimRollback(ks), all(newV, len(ks))...)
	e.expect("claim again", ks, e.claimRollback(ks), all(newV, len(ks))...)
	e.expect("claim, committed", ks, e.claim(ks), all(newV, len(ks))...)
	e.expect("claim after commit", ks, e.claim(ks), all(dup, len(ks))...)
	more := e.keys("s", 10, 15)
	e.expect("new keys, rolled back", more, e.claimRollback(more), all(newV, len(more))...)
	e.expect("new keys again", more, e.claim(more), all(newV, len(more))...)
}

// testScopesAreIndependent: a key of one scope never makes the same key of
// another scope a duplicate.
func testScopesAreIndependent(e *env) {
	a := e.keys("a", 0, 5)
	e.expect("scope a", a, e.claim(a), all(newV, 5)...)
	b := e.keys("b", 0, 5)
	e.expect("scope b", b, e.claim(b), all(newV, 5)...)
	ks := []dedupe.Key{e.key("a", 5), e.key("b", 5), e.key("c", 0), e.key("a", 0), e.key("b", 0), e.key("c", 0)}
	e.expect("batch over three scopes", ks, e.claim(ks), newV, newV, newV, dup, dup, dup)
	ks = []dedupe.Key{e.key("c", 1), e.key("c", 0), e.key("b", 6)}
	e.expect("after the mixed batch", ks, e.claim(ks), newV, dup, newV)
}

// testLargeBatch: a batch of thousands of keys, half of them old.
func testLargeBatch(e *env) {
	const n = 5000
	half := e.keys("s", 0, n/2)
	e.expect("first half", half, e.claim(half), all(newV, n/2)...)
	ks := e.keys("s", 0, n)
	e.expect("whole batch", ks, e.claim(ks), append(all(dup, n/2), all(newV, n/2)...)...)
	e.expect("whole batch again", ks, e.claim(ks), all(dup, n)...)
}

// testEmptyBatch: nothing to claim is not an error.
func testEmptyBatch(e *env) {
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		e.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, ks := range [][]dedupe.Key{nil, {}} {
		vs, err := e.s.Claim(ctx, tx, ks)
		if err != nil || len(vs) != 0 {
			e.Errorf("Claim(%#v) = %v, %v; want no verdicts and no error", ks, vs, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		e.Fatalf("commit after empty claims: %v", err)
	}
	e.committed(nil, nil)
	ks := e.keys("s", 0, 2)
	e.expect("after empty batches", ks, e.claim(ks), newV, newV)
}

// testCancelledContext: Claim with a cancelled context fails and claims
// nothing.
func testCancelledContext(e *env) {
	ks := e.keys("s", 0, 3)
	tx, err := e.pool.Begin(context.Background())
	if err != nil {
		e.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	vs, err := e.s.Claim(ctx, tx, ks)
	if err == nil {
		e.Errorf("Claim with a cancelled context = %v, nil; want an error", vs)
	}
	_ = tx.Rollback(context.Background())
	e.expect("after the cancelled claim", ks, e.claim(ks), newV, newV, newV)
}
