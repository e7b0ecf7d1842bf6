package dedupetest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
)

// Harness adapts a strategy to the suite.
type Harness struct {
	// New returns a fresh strategy whose tables exist (migrated) in a fresh database, and a pool on that database.
	New func(t *testing.T) (dedupe.Strategy, *pgxpool.Pool)
	// Key returns the i-th distinct key of scope (i = 0, 1, 2, …). The suite claims keys of one scope in increasing i (only the Sequencer check, for a strategy that implements dedupe.Sequencer, claims key 1 before key 0), so a sequence strategy can map i to seq i+1 of one sender.
	Key func(scope string, i int) dedupe.Key
	// Fingerprints is true when the strategy detects a reused key with another payload (VerdictMismatch).
	Fingerprints bool
}

// Run runs the conformance suite against the strategy h adapts. Every
// subtest gets its own strategy and database from h.New, and most run in
// parallel.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil || h.Key == nil {
		t.Fatal("dedupetest: Harness.New and Harness.Key are required")
	}
	tests := []struct {
		name string
		run  func(*env)
	}{
		{"NewThenDuplicate", testNewThenDuplicate},
		{"MixedBatchInOrder", testMixedBatchInOrder},
		{"RepeatedKeysInBatch", testRepeatedKeysInBatch},
		{"MismatchAgainstCommittedMarker", testMismatchAgainstCommittedMarker},
		{"MissingFingerprintNeverMismatches", testMissingFingerprint},
		{"RollbackLeavesNoMarker", testRollbackLeavesNoMarker},
		{"ScopesAreIndependent", testScopesAreIndependent},
		{"LargeBatch", testLargeBatch},
		{"EmptyBatch", testEmptyBatch},
		{"CancelledContext", testCancelledContext},
		{"SecondClaimerWaitsForFirst", testSecondClaimerWaits},
		{"ConcurrentClaimersOneKey", testConcurrentOneKey},
		{"ConcurrentOverlappingBatches", testConcurrentOverlapping},
		{"InspectorStats", testInspectorStats},
		{"InspectorSweep", testInspectorSweep},
		{"KeyChecker", testKeyChecker},
		{"Sequencer", testSequencer},
		{"Committer", testCommitter},
		{"Retainer", testRetainer},
		{"Migrator", testMigrator},
		{"Maintainer", testMaintainer},
		{"Warmer", testWarmer},
		{"StatsReporter", testStatsReporter},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, pool := h.New(t)
			if s == nil || pool == nil {
				t.Fatal("dedupetest: Harness.New returned a nil strategy or pool")
			}
			tc.run(&env{T: t, h: h, s: s, pool: pool})
		})
	}
}

// env is one subtest's strategy and database.
type env struct {
	*testing.T
	h    Harness
	s    dedupe.Strategy
	pool *pgxpool.Pool
}

// keys returns the keys i = from, …, to-1 of scope.
func (e *env) keys(scope string, from, to int) []dedupe.Key {
	ks := make([]dedupe.Key, 0, to-from)
	for i := from; i < to; i++ {
		ks = append(ks, e.key(scope, i))
	}
	return ks
}

// key returns key i of scope without a fingerprint.
func (e *env) key(scope string, i int) dedupe.Key {
	k := e.h.Key(scope, i)
	k.Fingerprint = nil
	return k
}

// fpKey returns key i of scope with the fingerprint of payload.
func (e *env) fpKey(scope string, i int, payload string) dedupe.Key {
	k := e.key(scope, i)
	k.Fingerprint = dedupe.Fingerprint([]byte(payload))
	return k
}

// pick returns the keys of scope with the given indexes, in that order.
func (e *env) pick(scope string, is ...int) []dedupe.Key {
	ks := make([]dedupe.Key, len(is))
	for j, i := range is {
		ks[j] = e.key(scope, i)
	}
	return ks
}

// claimTx calls Claim and checks that it returned one verdict per key.
func (e *env) claimTx(ctx context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	vs, err := e.s.Claim(ctx, tx, keys)
	if err == nil && len(vs) != len(keys) {
		return vs, fmt.Errorf("claim returned %d verdicts for %d keys", len(vs), len(keys))
	}
	return vs, err
}

// committed tells the strategy, when it wants to know, what committed.
func (e *env) committed(keys []dedupe.Key, vs []dedupe.Verdict) {
	if c, ok := e.s.(dedupe.Committer); ok {
		c.Committed(keys, vs)
	}
}

// claim claims keys in a transaction of its own and commits it.
func (e *env) claim(keys []dedupe.Key) []dedupe.Verdict {
	e.Helper()
	return e.claimEnd(keys, true)
}

// claimRollback claims keys in a transaction of its own and rolls it back.
func (e *env) claimRollback(keys []dedupe.Key) []dedupe.Verdict {
	e.Helper()
	return e.claimEnd(keys, false)
}

func (e *env) claimEnd(keys []dedupe.Key, commit bool) []dedupe.Verdict {
	e.Helper()
	return e.claimCommit(keys, commit, commit)
}

// claimCommit claims keys in a transaction of its own, commits it if
// commit, and reports the verdicts to a Committer if report.
func (e *env) claimCommit(keys []dedupe.Key, commit, report bool) []dedupe.Verdict {
	e.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		e.Fatalf("begin: %v", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	vs, err := e.claimTx(ctx, tx, keys)
	if err != nil {
		e.Fatalf("Claim(%s): %v", describe(keys), err)
	}
	if commit {
		if err := tx.Commit(ctx); err != nil {
			e.Fatalf("commit: %v", err)
		}
		if report {
			e.committed(keys, vs)
		}
	}
	return vs
}

// expect fails the test unless got equals want.
func (e *env) expect(what string, keys []dedupe.Key, got []dedupe.Verdict, want ...dedupe.Verdict) {
	e.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i] == want[i] || want[i] == duplicateOrMismatch &&
			(got[i] == dedupe.VerdictDuplicate || got[i] == dedupe.VerdictMismatch)
	}
	if !ok {
		e.Errorf("%s: Claim(%s)\n got  %v\n want %v", what, describe(keys), got, verdictList(want))
	}
}

// duplicateOrMismatch stands, in a wanted verdict list, for either verdict.
const duplicateOrMismatch dedupe.Verdict = 255

type verdictList []dedupe.Verdict

func (l verdictList) String() string {
	s := make([]string, len(l))
	for i, v := range l {
		s[i] = v.String()
		if v == duplicateOrMismatch {
			s[i] = "duplicate|mismatch"
		}
	}
	return "[" + strings.Join(s, " ") + "]"
}

// all returns n copies of v.
func all(v dedupe.Verdict, n int) []dedupe.Verdict {
	vs := make([]dedupe.Verdict, n)
	for i := range vs {
		vs[i] = v
	}
	return vs
}

// reused is the verdict expected for a reused key with another payload:
// a mismatch when the strategy fingerprints, else a duplicate (or a
// mismatch, when it happens to notice). Never new.
func (e *env) reused() dedupe.Verdict {
	if e.h.Fingerprints {
		return dedupe.VerdictMismatch
	}
	return duplicateOrMismatch
}

// describe renders keys briefly for failure messages.
func describe(keys []dedupe.Key) string {
	const max = 12
	var b strings.Builder
	b.WriteString("[")
	for i, k := range keys {
		if i == max {
			fmt.Fprintf(&b, " … %d more", len(keys)-max)
			break
		}
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(k.String())
		if len(k.Fingerprint) > 0 {
			fmt.Fprintf(&b, "(fp %x)", k.Fingerprint[:2])
		}
	}
	b.WriteString("]")
	return b.String()
}
