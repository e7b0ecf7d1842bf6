// Package dedupetest is the conformance suite every dedupe.Strategy passes.
//
// A strategy's tests adapt it with a Harness and call Run:
//
//	func TestConformance(t *testing.T) {
//		dedupetest.Run(t, dedupetest.Harness{
//			New: func(t *testing.T) (dedupe.Strategy, *pgxpool.Pool) {
//				pool := pgtest.NewPool(t)
//				s, _ := idset.New(idset.Config{})
//				_, _ = pg.Migrate(context.Background(), pool, "", s.Migrations()...)
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
// (Harness.Key), without gaps (except in the Sequencer check below), so a sequence-based strategy can map i to
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
//
// # Optional interfaces
//
// Every optional interface listed in package dedupe's documentation has a
// subtest of its name, which finds it by type assertion, as consumer.New
// does, and skips (saying so) when the strategy does not implement it. Each
// checks what the interface's documentation promises:
//
//   - KeyChecker: CheckKey accepts the harness's keys; it refuses with a
//     *dedupe.KeyError; a key it refuses (among malformed variants the
//     suite makes: empty scope, NUL bytes, invalid UTF-8, 64 KiB fields, a
//     negative Seq, …) is refused by Claim too, with an error matching
//     dedupe.ErrInvalidKey, alone or after a good key; and a key that
//     Claim fails on is one CheckKey refuses, so that the consumer parks
//     its message alone instead of failing the batch.
//   - Sequencer: Sequenced answers the same on every call, before and after
//     claims; when it answers false, claiming key 1 before key 0 leaves key
//     0 new (the one place the suite claims out of order), since the
//     consumer would not hold key 1 back.
//   - Committer: with the verdicts of committed claims reported (repeats,
//     mismatches and several scopes in one batch), later verdicts are
//     right; a rolled-back claim, never reported, leaves its keys new; a
//     commit never reported (as another process's) is seen all the same;
//     and claims reported from several goroutines at once are right.
//   - Retainer: Retention is positive and the same on every call; for an
//     Inspector, SweepExpired sweeps (no dedupe.ErrNoSweep) at that
//     retention.
//   - Migrator: on the harness's store Migrate applies nothing more; on an
//     empty database PendingMigrations lists every migration of the lines,
//     Migrate applies them all, a second Migrate nothing, and the strategy
//     claims there (after Maintain, for a Maintainer); the script of
//     pg.MigrationSQL, run on another empty database, does the same.
//     The empty databases are created on the harness's server, so its role
//     needs CREATEDB; the migrations table's schema is the one in which the
//     harness recorded the lines (pg.DefaultSchema if none).
//   - Maintainer: Maintain succeeds twice in a row and keeps live markers;
//     claims are right while RunMaintenance runs, which does not fail on
//     its own and returns, nil or with the context's error, within ten
//     seconds of its context being cancelled.
//   - Warmer: Warm with a cancelled context returns promptly; claims made
//     after it, while Warm runs and after it returned give the verdicts
//     they would without it, for markers committed and reported, committed
//     unreported, and rolled back; a Warm that has not returned by itself
//     within ten seconds is cancelled and must then return.
//   - StatsReporter: ReportStats reports at least one statistic that
//     dedupe.CheckStats accepts, with finite values and no negative
//     counter; claims change values but not names, kinds, help texts or
//     their order; no counter goes down; and it runs safely beside claims.
//
// The suite checks itself: its tests run it against deliberately broken
// strategies and require the subtest meant to catch each one to fail.
package dedupetest
