// Package switchover changes a consumer's dedupe strategy without a window
// of doubles, and tries a strategy on production traffic before switching
// to it.
//
// # Migration
//
// A new strategy's store knows none of the keys the old one recorded, so a
// consumer switched from idset to bloom (or highwater) would apply again
// every message redelivered or replayed within the old retention. A
// Migration closes that window: its Strategy claims each batch with the
// old strategy first, under a savepoint that is always rolled back (the
// old store gets no new markers; its own maintenance keeps sweeping it),
// and a key whose first occurrence the old strategy calls a duplicate or a
// mismatch keeps that verdict. The other keys are claimed by the new
// strategy, in the same transaction, and get its verdicts. The keys the
// old store knows are not given to the new strategy at all: their markers
// are not needed (the old store answers for them as long as they could be
// redelivered), and a sequence strategy would otherwise move a sender's
// mark past a message the old strategy never applied.
//
// Config.Until is when the old store stops being consulted: Since plus
// the old strategy's retention by default. From then on claims go to the
// new strategy alone, Status reports the old store droppable, and after
// every consumer of the scope is past Until its tables can be dropped.
// docs/changing-strategy.md has the procedure.
//
// The old strategy is asked by a claim rolled back, not by a read-only
// lookup: the strategies offer none, and a claim also waits for a
// concurrent claim of the same key in the old store (a consumer not yet
// switched) instead of reading past it. The cost is one savepoint and one
// more claim a batch, at most four statements whatever the batch size.
//
// # Shadow
//
// A Shadow's Strategy returns the live strategy's verdicts, and claims
// every batch with a second strategy too, under a savepoint that it
// releases, so that the shadow's markers commit or roll back with the
// batch exactly as the live ones do and it learns the traffic: a shadow
// that never wrote would call every redelivery new. A shadow claim that
// fails is rolled back to its savepoint, counted and logged, and changes
// nothing; keys the shadow's CheckKey refuses are left out of its claim
// and counted. Stats count the keys by their pair of verdicts;
// ShadowConfig.OnDisagree sees each disagreement, and a log line with a
// sample is written at most every ShadowConfig.LogEvery.
//
// # Optional interfaces
//
// Both wrappers hand out a Strategy that implements exactly what the
// consumer may rely on (the dedupe package lists the interfaces):
//
//	              Migration                          Shadow
//	KeyChecker    when old or new is one: both       when live is one: live's
//	              must accept the key
//	Sequencer     new's                              live's
//	Committer     new's, told only the keys that     live's with the verdicts;
//	              committed as new (the keys it      shadow's, told the keys
//	              claimed and made new)              its own claim made new
//	Retainer      when new is one: new's             when live is one: live's
//	Migrator      both                               both
//	Maintainer    both, side by side                 both, side by side
//	Warmer        both, side by side                 both, side by side
//	Inspector     new's, with old's tables and       live's
//	              the switch in Details
package switchover
