// Package dedupe is the contract between the consumer loop and the
// strategies that recognise messages already processed.
//
// A Strategy claims a whole batch of Keys inside the caller's pgx.Tx. For
// every key it calls VerdictNew it writes a marker in that transaction, so the
// marker becomes durable exactly when the message's business effect does: if
// the handler fails and the transaction rolls back, no marker remains and the
// redelivered message is new again. A key whose marker already exists is
// VerdictDuplicate; the same key with another payload fingerprint is
// VerdictMismatch; a sequence number that skips ahead is VerdictGap.
//
// Implementations live in the sub-packages idset (a processed-ID table),
// highwater (per-sender sequence marks) and bloom (a Bloom prefilter over
// time-partitioned markers). Package dedupetest holds the conformance suite
// every strategy passes.
//
// Tables are created by numbered SQL migrations embedded in each package,
// handed out as Lines by whatever owns them (see Migrator), and applied with
// Migrate, listed with PendingMigrations, or printed with MigrationSQL for a
// DBA to review: the one entry point, which consumer.Consumer.Migrate and
// the CLI's migrate command use too.
// Schema and table names are configurable and always quoted.
package dedupe
