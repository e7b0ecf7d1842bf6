// Package dedupetest is the conformance suite every dedupe.Strategy passes.
//
// A strategy's tests adapt it with a Harness and call Run:
//
//	func TestConformance(t *testing.T) {
//		dedupetest.Run(t, dedupetest.Harness{
//			New: func(t *testing.T) (dedupe.Strategy, *pgxpool.Pool) {
//				pool := pgtest.NewPool(t)
//				s, _ := idset.New(idset.Config{})
//				_, _ = dedupe.Migrate(context.Background(), pool, "", s.Migrations()...)
//				return s, pool
//			},
//			Key: func(scope string, i int) dedupe.Key {
//				return dedupe.Key{Scope: scope, ID: fmt.Sprintf("id-%d", i)}
//			},
//			Fingerprints: true,
//		})
//	}
//
// Run checks what the consumer relies on: verdicts in the order of the keys;
// a committed claim makes its keys duplicates and a rolled-back one leaves
// nothing behind; repeats within a batch are decided by their first
// occurrence; a key reused with another payload is never new (a mismatch
// when the strategy fingerprints) and a missing fingerprint never
// mismatches; scopes are independent; large and empty batches work; a
// cancelled context fails the claim. Concurrency is checked with real
// transactions: a claim of a key held by an open transaction waits for it
// and sees its outcome, and two transactions racing for the same keys, in
// many rounds that commit or roll back either side, never both make a key
// new.
//
// Within one scope the suite claims new keys in increasing order of i
// (Harness.Key), without gaps, so a sequence-based strategy can map i to
// sequence number i+1 of one sender. When the strategy implements
// dedupe.Committer, the suite calls Committed after every commit, as the
// consumer does.
//
// A strategy that implements dedupe.Inspector is checked as one (the
// Inspector subtests are skipped for others): MarkerStats names the
// strategy and its migrated tables, reports the scopes of committed claims
// and never of rolled-back ones, with at least one and at most as many
// markers as keys claimed, ordered by scope, and honours its scope filter;
// SweepExpired either reports dedupe.ErrNoSweep, or removes nothing in a
// dry run and never removes markers younger than the retention.
package dedupetest
