// Package outbox is the pipeline half of effectively: a stage emits
// messages inside the transaction that writes its effect and marker, and a
// relay publishes them, at least once and per key in commit order, with
// IDs the next stage dedupes by. A chain of stages is then effectively-once
// end to end.
//
// # Emitting
//
// Outbox.Emit adds messages inside any pgx.Tx, in one statement however
// many there are: from a consumer's Handler or BatchHandler, or from plain
// code (an HTTP handler that writes an order and announces it). They exist
// exactly when the transaction commits: a rollback emits nothing. A
// consumer's QueueHandler, which has a queue and no transaction, emits
// with Outbox.EmitQueued: its INSERT runs in the batch's transaction, and
// the consumer sends the emits of the whole batch as one INSERT in the
// batch's round trip (consumer.Combiner). Emit
// refuses what it can judge (an empty or, when Config.Sinks is set,
// unknown sink, bad or reserved header names, a message over
// MaxMessageBytes) with a *MessageError wrapping ErrInvalid, and writes
// nothing of the call then. What only the broker can judge is parked by
// the relay.
//
// Apply the outbox's migrations with the rest: Outbox.Line is a
// pg.Line for pg.Migrate and pg.MigrationSQL, as a consumer's
// Migrations are.
//
// # IDs
//
// Every message carries an ID, which the relay sends as the
// "idempotency-key" header (IDHeader): the header sources/kafka
// (DefaultIDHeader) and the attribute sources/sqs (DefaultIDAttribute)
// take as the default dedupe ID, so the next stage drops a relay's
// duplicates with no configuration. Inside a handler, EmitFor (or ID)
// derives it from the input: (scope, input dedupe key, ordinal of the emit
// within the input), so applying the same input again gives the same IDs.
// A message given an ID keeps it; outside a consumer, Emit makes a random
// one.
//
// What the replay workflows of docs/replay.md do to a pipeline follows:
// replaying a range in the same scope applies only what has no marker, and
// an input applied again in the same scope (its marker gone) emits the same
// IDs, which the next stage drops as duplicates. Recomputing into a new
// scope applies every input again and emits new IDs, so the next stage
// applies them again: recompute the next stage too, or make its effect
// idempotent by construction.
//
// # Which relay: Config.Mode
//
// How a key's messages keep commit order depends on the relay that reads
// the outbox, so the emitters name it in Config.Mode. In LogMode, the
// default, the outbox is read by a LogRelay, which receives committed
// transactions in commit order from the WAL: Emit writes the messages with
// one INSERT and nothing else. In TableMode the outbox is read by the
// table-polling Relay, which needs the per-key counter described next (a
// LogRelay reads a TableMode outbox too). A Relay parks the keyed messages
// of a LogMode outbox (ErrUnordered) rather than publish them out of order.
//
// # Order without a cursor (TableMode)
//
// Each emit takes a sequence number per (sink, key) from a counter row,
// with INSERT … ON CONFLICT DO UPDATE SET seq = seq + n, in the emitting
// transaction. Emitters of one key queue on that row until the holder
// commits or aborts, so a key's sequence numbers are dense and in commit
// order, and a key's message with seq n is visible only once those before
// it are. The relay keeps no cursor: each pass reads, in one snapshot, the
// unpublished rows of its partitions, per key in seq order and only while
// no earlier row of the key is parked or waiting for a retry. A
// transaction that commits late is simply read by a later pass; one left
// open holds back only the keys it emitted to (and their later emitters
// wait for it), never the others. Messages with a nil Key have no order
// (seq 0) and take no counter row; in LogMode no message does.
//
// A key's seq orders only the rows that wait at the same time: the relay's
// cleanup deletes the counter of a key with no row waiting (none
// unpublished, none parked), and the key's next message starts again at
// 1, after every earlier one was published.
//
// The cost: two transactions emitting to one key serialize, so keep
// emitting transactions short. One Emit call takes its keys' rows in
// order, but two transactions that emit to keys a then b and b then a in
// separate calls can deadlock: PostgreSQL aborts one, and a consumer rolls
// back and retries it. Emit a batch's messages in one call (as a
// BatchHandler does), or keep the keys of concurrent lanes apart (as Kafka
// partitions do), and it does not happen.
//
// # Several relays
//
// Keys hash into Partitions virtual partitions. Each partition is leased
// to one relay at a time, with an expiry and a generation that grows with
// every change of holder; relays heartbeat and each takes its share.
// Before publishing, a relay checks by its own clock that its lease has
// LeaseMargin to run, and publishes under a deadline at that point;
// marking rows published (or parked, or for retry) is fenced by the
// generation, so a relay that froze and woke after its lease has passed to
// another publishes and marks nothing. A publish that was already on the
// wire when the lease ended can still land: a duplicate with the same ID,
// after the new holder's copies.
//
// # Publishing
//
// A Sink publishes one destination's messages and says, per message, what
// failed (PublishErrors) and whether for good (Permanent). A sink reports
// a message published only once the destination acknowledged it, and
// sends nothing of a key after a failed message of it. KafkaSink sends its
// own produce requests with a kafka-go Writer's settings (Kafka key =
// message key), one request per partition in flight, and refuses a Writer
// under which the broker would not acknowledge. SQSSink sends with
// SendMessageBatch (the ID as the idempotency-key attribute; on a FIFO
// queue MessageGroupId = key and MessageDeduplicationId = the ID, or its
// hash when it does not fit, one message of a group per request). The
// relay marks a row published only after its sink said so: a crash at any
// point before the mark republishes it, with the same ID. Once a key's
// message fails, the key's later messages of the batch are not marked
// (a sink of its own that wrote them anyway causes a duplicate, never a
// reordering of what is marked). A transient failure is retried with a doubling backoff, with
// no limit (the row's attempts and last_error columns say why a key is
// waiting); a refusal for good is retried alone (brokers refuse whole batches for one
// message) and then parked with the reason, in the outbox table itself,
// holding back only its key until Outbox.Redrive or Outbox.Purge.
// RelayConfig.Redact (LogRelayConfig.Redact) decides what of the message
// a parked row keeps: the value and headers it returns replace the
// message's in the statement that parks it. Parked
// rows are never deleted by the cleanup, which deletes published rows
// older than Retention in batches of CleanupBatch; with Retention
// DeleteOnPublish, the relay deletes each row as it marks it published,
// its cheapest setting.
//
// A relay works in a pipeline of two batches: while one is published, the
// one before is marked and the next is read. The next one excludes the
// rows in flight, and before it is published every key the current batch
// did not publish (a failure, or a row held behind one) is dropped from
// it, so no message overtakes one of its key. Marks commit without
// waiting for the WAL flush: a database crash may forget the last ones,
// and those messages are published again with the same IDs. The relay's
// statements are planned on every call, with the table as it is then.
//
// The relay wakes on the NOTIFY that the emitting transaction sends (and
// PostgreSQL delivers only on commit), and polls every PollInterval as a
// fallback; PollOnly turns LISTEN off for PgBouncer's transaction pooling.
// Run checks for a pooler at start-up (pg.CheckPooling): behind a
// transaction pooler it warns and polls without PollOnly, and it refuses a
// pool whose pgx exec mode keeps prepared statements (docs/pgbouncer.md).
// Run returns when its context is done, after marking what the pass in
// progress published and giving its leases back.
//
// # Reading the log instead
//
// LogRelay publishes the same outbox from PostgreSQL's logical replication
// stream (pgoutput, through jackc/pglogrepl): each committed transaction's
// rows arrive once it commits, in commit order, so it needs no cursor, no
// lease and no mark per message. Its position is its replication slot's
// confirmed LSN, advanced only once the sinks acknowledged everything
// before it. One relay reads a slot at a time (PostgreSQL allows one
// walsender per slot); others stand by and take over. The table keeps each
// row until the slot confirmed it: a slot dropped, lost in a failover or
// invalidated by max_slot_wal_keep_size is created again and the
// unconfirmed rows are published from the table, per key in seq and then
// id order (in LogMode, insertion order: commit order but between
// transactions that emitted to one key at the same time), with the same
// IDs. The cleanup deletes confirmed rows by id range. It
// needs wal_level = logical, a role with REPLICATION and a direct
// connection; Relay remains the choice behind PgBouncer or without logical
// decoding. Never run both on one outbox. docs/pipelines.md has the
// details and the DBA's checklist.
//
// # Operating
//
// RelayConfig.Hooks report each publish pass (PassStats: per sink,
// published, retried, parked and held messages, publish and
// commit-to-publish times) and, through optional interfaces, wake-ups,
// lease changes and the backlog; metrics/effprom and tracing/effotel have
// adapters. Outbox.Stats and Outbox.Rows report and list what waits, and
// the effectively command's "outbox" subcommands use them.
package outbox
