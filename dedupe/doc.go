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
//
// CheckPooling finds a connection pooler between a pool and the server and
// sees transaction pooling (PgBouncer's pool_mode = transaction); Migrate
// runs it first and refuses, with ErrTransactionPooling and the setting to
// change, pgx connections whose prepared statements cannot cross such a
// pooler. Every advisory lock the library takes is transaction-level.
//
// # Optional interfaces
//
// A Strategy may also implement the interfaces below. consumer.New finds
// them once, and each strategy of this module asserts the ones it
// implements at compile time (var _ dedupe.Maintainer = (*Strategy)(nil)),
// so that a drifting signature fails to build instead of silently turning a
// feature off. A new strategy should do the same.
//
//   - KeyChecker (highwater): the consumer checks every key before the
//     claim, and parks a message whose key the strategy cannot store
//     (reason invalid_key) instead of failing its whole batch.
//   - Sequencer (highwater, true in Monotonic mode): the consumer holds a
//     sender's later messages back while an earlier one awaits redelivery,
//     since applying the later one first would make the earlier one look
//     like a duplicate.
//   - Committer (highwater's cache of marks, bloom's filters): after each
//     COMMIT the consumer reports the verdicts that committed, so in-memory
//     state never runs ahead of the database.
//   - Retainer (idset, bloom: markers that expire): at start-up the
//     consumer compares Retention with its source's redelivery horizon and
//     content-ID window (consumer.HorizonSource, consumer.ContentIDSource)
//     and warns when a marker could expire before the message is delivered
//     again, or outlive the broker's memory of a payload.
//   - Migrator (idset, highwater, bloom): Consumer.Migrations and
//     Consumer.Migrate include its migration lines; so does the CLI.
//   - Maintainer (idset: the retention sweeper, unless
//     idset.Config.ManualSweep; bloom: creating and dropping partitions):
//     the consumer calls Maintain before its first claim (Run fails if it
//     does), then runs RunMaintenance in the background until Run returns,
//     logging an error if it stops early.
//   - Warmer (bloom: loading the filters of closed slices): the consumer
//     runs Warm in the background when Run starts; claims are correct
//     before it finishes, only slower.
//   - Inspector (idset, highwater, bloom): MarkerStats and SweepExpired,
//     through which the CLI's stats and sweep commands describe and sweep
//     any strategy without reading its tables.
//   - StatsReporter (highwater: its cache and gaps; bloom: its filters and
//     probes): ReportStats returns the strategy's in-memory counters and
//     gauges by name, which metrics/effprom's StrategyMetrics exports for
//     any strategy that has them, without importing the strategy.
//
// dedupetest checks every one of these that a strategy implements.
//
// Every package that reaches PostgreSQL takes a DB, which *pgxpool.Pool,
// *pgx.Conn and pgx.Tx all satisfy. Bad configuration is reported with a
// *ConfigError matching ErrInvalidConfig in every package of the module,
// and schema and table names from configuration are checked with
// ValidateIdentifier.
package dedupe
