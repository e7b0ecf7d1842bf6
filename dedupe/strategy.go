package dedupe

import (
	"context"
	"time"

	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
)

// Verdict is a strategy's decision about one key.
type Verdict uint8

const (
	// VerdictNew means the key was never seen: the strategy wrote its marker
	// in the transaction, and the message's effect must commit with it.
	VerdictNew Verdict = iota + 1
	// VerdictDuplicate means a marker for the key already exists: nothing runs.
	VerdictDuplicate
	// VerdictGap means the key's sequence number is ahead of what the sender's
	// mark allows (a message in between is missing): it is neither applied nor
	// acknowledged, so the source delivers it again later.
	VerdictGap
	// VerdictMismatch means a marker for the key exists with another payload
	// fingerprint: the producer reused a key for a different message.
	VerdictMismatch
)

// String returns the verdict's lower-case name.
func (v Verdict) String() string {
	switch v {
	case VerdictNew:
		return "new"
	case VerdictDuplicate:
		return "duplicate"
	case VerdictGap:
		return "gap"
	case VerdictMismatch:
		return "mismatch"
	}
	return "invalid"
}

// Strategy decides, inside the caller's transaction, which messages of a batch
// are new. For each key it calls new it writes a marker in tx, so the marker
// commits or rolls back together with the message's effect.
//
// Claim must use a constant number of statements for the whole batch, must
// return one verdict per key in order, and must treat a key repeated within
// keys like a redelivery: the first occurrence decides, later ones are
// duplicates (or mismatches, if their fingerprints differ). Two transactions
// claiming the same key concurrently must never both get VerdictNew: the
// second blocks until the first ends and then sees its outcome.
//
// A Strategy is safe for concurrent use by several transactions.
//
// The optional interfaces that follow (KeyChecker, Sequencer, Committer,
// Retainer, Migrator, Maintainer, Warmer), Inspector and StatsReporter add
// to it; the package documentation lists who implements each and what the
// consumer (or a metrics adapter) does with it.
type Strategy interface {
	// Name identifies the strategy in logs and metrics ("idset", "highwater", …).
	Name() string
	// Claim decides the verdicts for keys and writes the markers of new keys in tx.
	Claim(ctx context.Context, tx pgx.Tx, keys []Key) ([]Verdict, error)
}

// KeyChecker is implemented by strategies that need particular fields of a
// key (an ID, or a sender and sequence number). The consumer checks every
// key before claiming, so a message whose key the strategy cannot store is
// parked alone instead of failing its batch. CheckKey returns a *KeyError.
type KeyChecker interface {
	CheckKey(k Key) error
}

// Sequencer is implemented by strategies that judge each sender's messages
// by sequence number in a way that a later sequence number applied first
// would make an earlier one look like a duplicate (highwater's monotonic
// mode). When Sequenced returns true, the consumer holds a sender's later
// messages back while an earlier one awaits redelivery.
type Sequencer interface {
	Sequenced() bool
}

// Committer is implemented by strategies that keep state in memory (caches,
// filters). The consumer calls Committed after the transaction that claimed
// keys committed, with the verdicts that committed; a rolled-back claim is
// never reported, so in-memory state never runs ahead of the database.
type Committer interface {
	Committed(keys []Key, verdicts []Verdict)
}

// Retainer is implemented by strategies whose markers expire. The consumer
// compares Retention with its source's redelivery horizon at start-up and
// warns when a redelivered message could outlive its marker.
type Retainer interface {
	Retention() time.Duration
}

// Migrator is implemented by strategies that own tables; Migrations returns
// the migration lines that create them, for use with Migrate.
type Migrator interface {
	Migrations() []pg.Line
}

// Maintainer is implemented by strategies whose storage needs upkeep while
// consumers run, such as creating and dropping time partitions. The
// consumer calls Maintain once before it claims anything, then runs
// RunMaintenance in the background until Run returns.
type Maintainer interface {
	Maintain(ctx context.Context, db pg.DB) error
	RunMaintenance(ctx context.Context, db pg.DB) error
}

// Warmer is implemented by strategies that load in-memory state from the
// store (a Bloom filter). The consumer starts Warm in the background when
// Run starts; the strategy must answer correctly before it finishes.
type Warmer interface {
	Warm(ctx context.Context, db pg.DB) error
}
