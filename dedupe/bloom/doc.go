// Package bloom is a dedupe.Strategy that keeps its markers in
// time-partitioned tables, so that retention is dropping a partition
// instead of deleting millions of rows, and puts Bloom filters
// (github.com/bits-and-blooms/bloom/v3) in front of the partitions, so that
// a new key rarely needs a probe into them.
//
// # Storage
//
// Markers (scope, id, slice, fingerprint, claim_version) live in a table
// partitioned by range of slice, the start of the time slice (Config.Slice,
// an hour by default) in which the marker was written. Each partition
// holds exactly one slice, so the primary key (scope, id, slice) makes
// (scope, id) unique within a partition. The migration creates only the parent table;
// Maintain creates the partition of the current slice and of
// Config.PartitionsAhead slices after it, each named after the parent and
// the slice start (bloom_markers_20260102t150000), and detaches
// (concurrently, so claims are not blocked) and drops every partition
// whose whole slice is older than Config.Retention. A marker therefore
// lives at least Retention and at most Retention + Slice (see below for a
// marker written just after its slice ended). All slice
// arithmetic uses the database's clock, so processes with skewed clocks
// agree on it.
//
// # Filters
//
// Each process keeps, per slice and per scope, one filter. The filter of a
// closed slice is sealed: Maintain (or Warm) builds it from the store once
// no transaction can write to the slice any more, sized from the number of
// markers it holds, at Config.FalsePositiveRate. A seal reads every slice
// it builds filters for in one transaction of two statements (the markers
// per slice and scope, then the keys, streamed), so a start-up over
// thousands of short slices (a week of one-minute slices is 10,080) costs
// the barrier's transaction and that one, not a transaction a slice.
// Since a sealed filter holds every marker of its slice, whichever process
// wrote it, its negative proves the slice holds no marker for the key, and
// the probe of that partition is skipped. Its positive is always
// confirmed by a probe: a false positive costs one index lookup, never a
// message. Sealed filters rotate out with their partitions.
//
// The current slice is different: every consumer writes to it, so no
// process's filter of it can be complete. Its markers are found by the
// insert itself: the unique index of the current partition turns a second
// marker for a key into a conflict, and the same statement then reads the
// existing marker's fingerprint. The process's own filter of the current
// slice (fed by Committed, sized from Config.ExpectedKeysPerSlice) is only
// a hint that probes likely duplicates before the insert, sparing them the
// conflict; size it for the slice's traffic, since an overfilled filter
// answers "maybe" for most new keys and each such answer costs a probe.
// Committed adds keys after their transaction committed, to the filter of
// the slice their own claim wrote them to (claims of several lanes may
// straddle a boundary); adding them at claim time would be just as safe,
// since a positive only costs a probe, but a rolled-back claim would then
// send its keys' redeliveries to needless probes.
//
// A slice that has closed but is not sealed yet (just after a boundary,
// before maintenance ran, or before Warm) is probed for every key; this is
// the fallback that keeps Claim correct before Warm completes.
//
// With Retention/Slice live slices, a new key is tested against that many
// filters, so a new key needs about (Retention/Slice) × FalsePositiveRate
// probes (0.84 with the defaults' 168 slices and 0.5%, 0.035 with 7 daily
// slices, instead of one probe per live slice); choose longer slices to
// probe less, shorter ones to expire more finely.
//
// # Claiming a batch
//
// Claim sends two statements in one round trip (a pgx.Batch, which
// PostgreSQL runs one after the other): it takes the gate, a
// transaction-level advisory lock that every claim holds shared and a
// barrier takes exclusively; then the claim statement. That statement reads
// the database clock and the clock of the latest barrier, which picks the
// slice the new markers go to (the barrier's), probes the (key, slice)
// pairs the filters could not rule out, inserts the other keys directly
// into that slice's partition with ON CONFLICT DO NOTHING, and reads the
// markers of the keys that conflicted there. Inserted keys are only
// counted, so a batch of new keys returns one row. Which pairs to probe is
// decided before the clocks are read, from this process's estimate of the
// database clock and of the latest barrier, so the statement also receives
// the slice the plan writes to and the span of clocks for which its live
// window holds, and does nothing but report the clocks when either is
// off; Claim then plans again from them and sends the claim statement once
// more, under the gate it already holds. That happens just after a slice
// boundary, when the oldest live slice changes within a slice (Retention
// not a multiple of Slice), or after a jump of either clock; it costs a
// round trip, never a wrong verdict. A key whose insert conflicted with a
// marker the statement's snapshot cannot see (committed by a concurrent
// claim while the insert waited for it, or written earlier in the same
// transaction) costs a second statement, for those keys only. Repeats
// within the batch are resolved in Go: the first occurrence decides, later
// ones are duplicates, or mismatches when their fingerprint differs from
// the marker.
//
// # Concurrency and the slice boundary
//
// Two transactions claiming one key never both get VerdictNew, even when
// they run in different processes whose filters differ and a slice boundary
// falls between them, and no claim takes a lock per key. Within one slice,
// the unique index of the slice's partition serialises them: the second
// insert waits for the first transaction and then conflicts. Across slices,
// the barrier does. A barrier is a moment when the gate is held
// exclusively, so no claim is in flight; its database clock is recorded in
// a sequence (Table_barrier, created by the migrations). A claim writes
// only to the slice of the latest barrier, read in its claim statement
// after it took the gate, so every claim of an earlier slice had ended
// before that barrier, and committed before the statement's snapshot: its
// marker is seen by the probe of its slice (or is in that slice's sealed
// filter). Claim therefore requires a READ COMMITTED transaction and
// returns ErrIsolation otherwise.
//
// Barriers come from seals (RunMaintenance runs one just after every slice
// boundary) and Warm, and from claims: a claim that expects to be the first
// of a new slice asks for the gate exclusively without waiting
// (pg_try_advisory_xact_lock), and when it gets it, it is the barrier, at
// the clock its statement reads. When claims are in flight it takes the
// gate shared and, like every claim until the next barrier, writes to the
// slice that just closed. No claim ever waits for the gate exclusively, so
// claims cannot deadlock on it. A marker written after its slice ended
// lives at least Retention less the time from the slice's end to the first
// barrier after it (normally well under a second: RunMaintenance's seal);
// if no barrier happens for longer than Retention (maintenance stopped
// while claims are in flight all the time), Claim fails rather than write
// to an expired slice. Every process claiming on a table must run this
// protocol: a process that took per-key locks instead (an earlier version)
// would not be serialised with it. The migration that adds the barrier's
// sequence therefore also adds the markers' claim_version column, NOT NULL
// without a default, which every claim of this protocol sets and an
// earlier version's insert does not: once the migration is applied, such
// a process's claims fail with a not-null violation (its consumer retries
// them, nothing applied) until it is replaced, rather than both processes
// seeing one key as new.
//
// Sealing relies on the gate too. A seal waits (at most Config.SealTimeout)
// until it holds the gate exclusively, which means no claim is in flight,
// and reads the database clock T while holding it, and records T as the
// latest barrier. Every claim that writes later reads that barrier, so it
// writes to T's slice or a later one: every slice that ended by T is
// complete, and its sealed filter, built in a later snapshot, holds every
// marker it will ever hold. Claims starting while a seal waits queue behind
// it, once per slice per process.
//
// # Operation
//
// Under a consumer, (*consumer.Consumer).Migrate and Run are all it takes:
// the consumer runs Maintain before its first claim, RunMaintenance in the
// background and Warm at start (Strategy implements dedupe.Maintainer and
// dedupe.Warmer). Used on its own, apply the migrations (pg.Migrate
// with Migrations) and run Maintain once, then run RunMaintenance in the background (it
// runs just after every slice boundary too, so the closed slice is sealed
// at once), and call Warm at start to build the filters from the live
// partitions, streaming, with progress logged. Claim returns ErrNoPartition if the current slice has no
// partition because maintenance did not run. Stats reports the filters'
// memory, the positives, the confirmed and false positives (the measured
// false-positive rate) and the probes saved, as one consistent snapshot
// however many lanes claim at once.
package bloom
