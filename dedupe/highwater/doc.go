// Package highwater is a dedupe strategy for producers that number their
// messages: it keeps one mark per (scope, sender), the highest sequence
// number applied, instead of one row per message. Storage and memory are
// O(senders), and a duplicate is recognised by comparing two integers.
//
// # Modes
//
// In Strict mode (the default) a sender's messages apply exactly once and in
// order: seq <= mark is a duplicate; seq == mark+1 is new and moves the mark
// in the claiming transaction, together with the message's effect; seq >
// mark+1 is a gap. Several consecutive seqs of one sender in one batch all
// apply (1, 2, 3 move the mark to 3). Within a batch keys are judged in batch
// order, which is the order their handlers run, exactly as if they had been
// delivered one by one: a seq that comes before the one that would fill its
// hole is a gap too.
//
// In Monotonic mode, for sequences with holes such as Kafka offsets or SQS
// FIFO sequence numbers, every seq above the mark is new and moves the mark
// to it; seq <= mark is a duplicate. There are no gaps.
//
// # Gaps, the reorder window and stuck senders
//
// A gap is neither applied nor acknowledged: the consumer hands the message
// back to its source, which delivers it again after consumer.Config.GapDelay,
// and parks it with reason "gap" after consumer.Config.GapMaxAttempts. Messages
// up to Config.ReorderWindow ahead of the next expected seq are ordinary
// reordering (an unordered source such as an SQS standard queue): they are
// held back quietly until the hole fills and then apply in order. A message
// further ahead is also a gap (held, never dropped), but it is logged as
// suspicious and counted in Stats.FarGaps, since the producer may have
// skipped or restarted its numbering.
//
// The strategy remembers, in memory, each sender that returned a gap, with
// its mark and lowest held seq (Strategy.Stuck, Stats.StuckSenders). When a
// sender has been stuck longer than Config.StuckAfter, a warning names the
// sender, its mark and its lowest held seq. Nothing moves a mark past a hole
// silently: Strategy.Advance does it on request, inside a transaction, and
// records who was skipped and why in an audit table.
//
// # Fingerprints
//
// The mark row keeps the payload fingerprint of the last applied message
// only, so storage stays O(senders). A redelivery of exactly that seq with
// another fingerprint is VerdictMismatch; an older seq is always
// VerdictDuplicate, whatever its fingerprint, since its fingerprint is no
// longer stored. Within one batch, a repeated seq is compared with the
// message that applied it earlier in the batch.
//
// # Cache
//
// A bounded LRU cache (Config.CacheSize senders) holds marks learned from
// committed claims only (Strategy.Committed), so a cached mark is never
// above the true one: it proves duplicates (seq <= cached mark) without a
// round trip, but never a new message, which the locked database row
// decides. A batch answered entirely by the cache runs no statement.
//
// # Database
//
// Claim inserts the rows of new senders and locks the batch's senders' rows
// (FOR UPDATE, in a fixed order) in one round trip, decides in Go, and
// moves all advanced marks of known senders in one UPDATE: at most three
// statements in two round trips per batch, whatever its size. Two transactions claiming the
// same sender take turns on its row, so a seq is never applied twice.
// Tables are created by the migrations from Strategy.Migrations (apply them
// with pg.Migrate, or through the consumer's Migrate); all identifiers
// are quoted.
//
// # Keys
//
// Keys need a Sender and a Seq of at least 1; Claim rejects others with a
// *dedupe.KeyError (CheckKey tells in advance). HeaderKey reads both from
// message headers, and ParseSeq parses a sequence number strictly (a
// positive decimal integer that fits in an int64), so that a message with
// a missing or malformed one is parked with a clear reason. With the
// consumer package:
//
//	cfg := consumer.Config{
//		Strategy: strategy,
//		KeyFunc: func(m *consumer.Message) (dedupe.Key, error) {
//			return highwater.HeaderKey(m.Header, "sender", "seq")
//		},
//		// ...
//	}
//
// In monotonic mode a message handed back for a retry must not be
// overtaken by a later seq of its sender, or it becomes a duplicate when it
// comes again. The consumer sees to it (Strategy.Sequenced reports true in
// monotonic mode): it holds a sender's later messages back while an earlier
// one awaits redelivery or was put on wait in the same batch, even when a
// producer copy of the awaited seq (same sender and seq, another stored
// message) comes first, as long as the process runs. Delivery in order
// within a sender (one lane per sender, like a Kafka partition) is assumed,
// and so is a source that, after a restart, delivers again in order what the
// previous process had handed back: Kafka does (the committed offset is the
// lowest one outstanding), and so does an SQS FIFO queue (a group's later
// messages stay behind an invisible one). An SQS standard queue orders
// nothing: use Strict mode there. Strict mode needs no help: a later seq is
// a gap until the earlier one applied.
package highwater
