// Package peers runs one ledger workload through this library and through
// the consumers a Go team would write or pick instead, on the same embedded
// Kafka (kfake) and the same PostgreSQL, and measures throughput and what
// each leaves in the ledger.
//
// The workload: N logical transfers, each a short JSON payload with a unique
// id; one in every DupEvery is produced a second time, DupLag messages later,
// as a producer that retried a send does. Records are produced with
// franz-go's kgo (a producer this library's authors did not write), keyed by
// the transfer id, with the id also in the "idempotency-key" header. Every
// consumer applies a transfer by inserting one row into the ledger table,
// ledger(msg_id, account, amount). The table has no unique constraint on
// msg_id: a unique constraint would be a dedupe mechanism of its own (and
// one that only works when the effect is a single insert keyed by the
// message), and the point is to see what each consumer's own mechanism
// does. Afterwards, for the N logical messages,
//
//   - lost effects are the ids with no ledger row,
//   - double effects are the ledger rows beyond one per id.
//
// The systems (Systems):
//
//   - this library: sources/kafka and the consumer with the idset strategy,
//     batches of 500, one row per message, with each handler shape (Shapes),
//     and sources/franz (franz-go's kgo client) with the same consumer and
//     the BatchHandler shape (FranzShape);
//   - Watermill v1.5.1 with its Kafka subscriber (watermill-kafka/v3, on
//     Sarama), a router handler that inserts the row in a pgx transaction,
//     and the router's Deduplicator middleware, both as shipped (its default
//     key is an Adler-32 checksum of the payload) and with the SHA-256 hasher
//     its documentation recommends;
//   - a hand-written kafka-go + pgx consumer: fetch, begin, insert, commit,
//     commit the offset, one message at a time; once as teams usually write
//     it, and once with a processed-ids table checked in the transaction;
//   - a hand-written franz-go + pgx consumer, the fair batched version: poll
//     up to 500 records, one transaction per batch that inserts the batch's
//     ids into a processed-ids table and the effects of the new ones (one
//     unnest statement each), then commit the offsets; rebalances wait for
//     the batch in hand. Being batched, it runs N of this library's size.
//
// Every consumer runs in a child process of its own (the running binary
// started again, see MaybeWorker), so that a crash is a real kill -9. A run
// is two phases per system:
//
//   - throughput: the consumer drains a topic of N logical messages (with
//     the producer duplicates) from the first record in hand to the last
//     record settled; N differs between systems (Options.Messages), so that
//     each runs for a comparable time, and the rates are compared;
//   - crash: the consumer kills itself (SIGKILL) right after the database
//     commit of record CrashAt and before it acknowledges that record to
//     Kafka, and a fresh consumer in the same group drains the rest; every
//     system reads the same workload of Options.CrashMessages.
//
// Run runs everything and Table prints the Markdown table; cmd/peerstable
// is the command. This module is not part of the library's workspace, so
// the library's go.mod never requires Watermill or Sarama.
package peers
