// Package chaos runs a Kafka source the way production does and breaks
// it on purpose: a broker in its own process (franz-go's kfake, cmd/broker,
// with the session expiry of Kafka's group coordinator that kfake misses
// for a member killed while its JoinGroup waited: package kafkatest),
// several worker processes built from the library (a consumer with the
// idset strategy, one effect row per message: package worker, given its
// source by a main package, cmd/worker for sources/kafka and
// franz/cmd/worker for sources/franz), and a driver (package chaostest,
// run by this package's test for sources/kafka and by package franz's for
// sources/franz), that produces a paced stream with producer duplicates
// and poison messages while it kills workers with SIGKILL, freezes one
// with SIGSTOP for longer than the session timeout, starts replacements,
// creates a topic the workers are configured to consume and adds
// partitions to another. Each worker runs in a slot; a killed worker's
// replacement takes its slot. Each slot has a static group instance ID
// (-instance-id), so a source with static membership (sources/franz)
// gives the replacement the dead member's place at once, without a
// rebalance (sources/kafka: kafka-go has no static membership, ignores
// it); CHAOS_STATIC=0 makes the workers dynamic members (see chaostest's
// staticFromEnv).
//
// At the end the test checks the promise of the library: exactly one effect
// per logical message, exactly the poison messages parked, stored offsets
// that never moved backwards, and stalls (time a partition had messages
// waiting and its position did not move) within the bound the Kafka source
// documents for its configuration (see stallBound). It prints a report.
//
// The short run (20,000 messages, 3 workers, 3 kills, 1 freeze) is part of
// the normal test suite and is skipped with -short; CHAOS_FULL=1 runs the
// full one (120,000 messages, 4 workers, 12 kills, 2 freezes), as
// `make soak-kafka` does. The workers are built without the race detector
// (CHAOS_WORKER_RACE=1 builds them with it): instrumented, four workers
// beside the broker and Postgres would starve a small machine and the
// stalls would measure the machine; the library's code runs under the race
// detector in its own packages' tests. See chaostest.Run for the other
// environment variables.
//
// TestKillStorm (CHAOS_STORM=1, as `make chaos-storm` runs it for both
// sources) measures what kills cost, as a ratio in one command: the same
// backlog consumed calm and under a storm of kills, each phase checked
// like the chaos run (see chaostest.Storm).
package chaos

// Headers the driver sets and the worker reads.
const (
	// IDHeader carries a message's idempotency key (the Kafka source's
	// default ID header).
	IDHeader = "idempotency-key"
	// PoisonHeader marks a message the worker's handler rejects as
	// permanently failed, so that it is parked.
	PoisonHeader = "chaos-poison"
)

// EffectsTable is the table the workers write one row per applied message
// into. It has no unique constraint on purpose: a second effect for a
// message must be visible, not refused.
const EffectsTable = "chaos_effects"

// EffectsDDL creates EffectsTable.
const EffectsDDL = `CREATE TABLE IF NOT EXISTS ` + EffectsTable + ` (
    msg_id    text        NOT NULL,
    topic     text        NOT NULL,
    partition integer     NOT NULL,
    off       bigint      NOT NULL,
    worker    text        NOT NULL,
    at        timestamptz NOT NULL DEFAULT clock_timestamp()
)`

// ReadyLine is what a broker or worker prints on stdout once it serves.
const ReadyLine = "ready"

// ApplicationName is the PostgreSQL application_name of a worker's
// connections, so that the driver can see its transactions.
func ApplicationName(worker string) string { return "chaos-" + worker }
