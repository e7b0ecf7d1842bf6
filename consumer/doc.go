// Package consumer runs the effectively-once loop: it fetches a batch of
// messages from one lane of a Source, derives each message's dedupe key,
// and in one PostgreSQL transaction claims the keys with a dedupe.Strategy,
// runs the handler for every new message, parks what cannot be applied, and
// commits. Only then does it acknowledge the batch to the source.
//
// # The promise
//
// For every message a source delivers, exactly one of these becomes durable,
// in the same transaction as the handler's writes: applied (the handler ran
// and its effect committed with the marker), duplicate (a marker already
// existed, nothing ran) or parked (the whole message sits in the parked
// table with the reason). A crash at any point leads to redelivery, and
// redelivery leads to duplicate. A handler error never leaves a marker.
//
// # Handler shapes
//
// Config takes one of three handlers:
//
//   - Handler is called once per new message with the batch's pgx.Tx, and
//     executes its statements itself: one round trip each. The simplest,
//     and the only shape whose code can wait for a result before choosing
//     its next statement, but the slowest: at a batch of 500 it runs at a
//     fraction of what the same rows written in bulk would (BENCHMARKS.md).
//   - QueueHandler is called once per new message too, but queues its
//     statements on a Queue instead of executing them; the consumer sends
//     those of the whole batch in one pipelined round trip. A callback set
//     on a queued statement reads its rows and may queue more statements,
//     which go in a next round trip, so a handler that reads before it
//     writes costs two round trips per batch. A failing statement is
//     attributed to the message that queued it. The choice for most
//     per-message code; but it has no pgx.Tx, so code that writes through
//     one (outbox.Emit, say) needs one of the other shapes.
//   - BatchHandler is called once per batch with all its new messages, to
//     write them with one statement (unnest, COPY): the fastest, for
//     effects that are the same for every message.
//
// # Batches and failures
//
// The happy path is one claim statement for the batch, the handler's own
// statements, and one commit: the framework adds no round trip per message.
// When a handler fails, the transaction rolls back and the batch runs again
// without the failed message (a QueueHandler's batch runs again that way up
// to four times, its statements pipelined each time); if failures keep
// coming, they are isolated under savepoints (one per message for a Handler
// or a QueueHandler, by bisection for a BatchHandler), so the rest of the
// batch still commits. A failed message goes back to its source with
// exponential backoff and jitter, and is parked after Config.MaxAttempts,
// or at once when its error is Permanent (a payload the handler cannot
// decode, say).
//
// Messages without a usable key (missing, empty, too long, not valid text,
// or a KeyFunc error) are parked with reason invalid_key; they never stop
// the loop. A handler panic is recovered and treated as a failure.
//
// # Lanes and shutdown
//
// Lanes (Kafka partitions, SQS receivers or FIFO groups) run in parallel,
// up to Config.Concurrency at a time, and in order within a lane. When Run's
// context is done, batches in flight commit or roll back and are settled
// with the source before Run returns, within Config.ShutdownTimeout; a
// handler that ignores its context past that is left behind, its batch
// rolled back and unacknowledged, and Run returns ErrShutdownTimeout.
//
// # Failures are visible
//
// Without a Config.Logger, warnings and errors go to stderr. A Fetch error
// is logged and retried with backoff; Run returns it when it persists past
// Config.SourceFailureTimeout or is Permanent. A finite source ends Run
// with ErrSourceDone, and Run then returns nil.
//
// # Failures at COMMIT
//
// When COMMIT is refused because of what a message wrote (a deferred
// constraint or constraint trigger), the batch is isolated with the
// deferred checks run after each message, and that message is retried and
// parked like a failing handler (*CommitCheckError). Transient refusals
// (serialization failures, deadlocks, a lock timeout, a cancel request)
// roll the batch back and it is delivered again after a backoff. When the
// connection is lost during COMMIT (or the batch's context is cancelled
// while COMMIT is on its way), the consumer finds out on another
// connection whether the batch committed, before it settles it: the
// markers its new messages claimed were written in the same transaction,
// so claiming the same keys again in a transaction that is rolled back
// sees them exactly when it did. A batch that committed is acknowledged
// and reported with its real outcomes; one that did not is handed back and
// delivered again (BatchStats.CommitLost is true either way). Only when the
// database cannot be asked within the bound (30s, or twice IdleTxTimeout
// when that is longer) are the messages reported as OutcomeUnknown and
// handed back; redelivery then settles them, duplicates if the commit went
// through, as long as the source still holds them: a source that stores
// its position in the transaction (Kafka) does not deliver them again once
// the lane has moved to another consumer if the batch committed.
//
// # A frozen worker
//
// A worker that freezes in the middle of a batch (a stopped process, a long
// GC pause, a lost host) keeps its transaction open, and with it the
// markers its claim took: another worker given the same message meanwhile
// (a Kafka partition handed over, an SQS visibility timeout run out) would
// wait in its claim for as long as the freeze lasts. Every batch
// transaction therefore sets idle_in_transaction_session_timeout to
// Config.IdleTxTimeout (10s by default), in the same round trip as its
// BEGIN: the server ends a session idle in its transaction for longer,
// rolls it back and releases its locks. The frozen worker's batch then
// fails when it wakes, and its redelivery is a duplicate. A worker frozen
// while its COMMIT was on its way to the server is ended the same way,
// and wakes to the server's answer (SQLSTATE 25P03; over a Unix socket,
// to a COMMIT it cannot send at all): the timeout is checked after a
// command is read and before it runs, so that answer means the COMMIT
// never ran. The batch is then handed back as rolled back, with no attempt
// counted, rather than resolved like a lost COMMIT: the markers a probe
// would find may be those of the consumer that took its messages over
// meanwhile. A handler that
// itself waits longer than that between two statements or after its last
// one (on an HTTP call, say) has its batch fail, and each such failure
// counts as an attempt of its message (of every message of the call, for a
// BatchHandler), so it is parked after Config.MaxAttempts with an
// *IdleTxError rather than delivered again for ever; keep such waits out of
// the transaction, or raise the timeout.
//
// # Whose failure it is
//
// One place (classifyHandlerErr) decides what a database error a handler
// met means, by its SQLSTATE, and docs/postgres-settings.md lists what the
// consumer does under each setting a DBA may give its role. A statement
// cancelled by statement_timeout (57014) did too much work of its own: a
// failure of its message (*TimeoutError), counted and parked after
// Config.MaxAttempts. A lock held elsewhere past lock_timeout (55P03), a
// serialization failure or a deadlock is the database's doing: the message
// is retried alone with backoff (*TransientError), the delivery is not
// counted, and it is never parked for it. A lock wait can only be told
// from slow work when lock_timeout fires first, so the consumer warns at
// start-up when statement_timeout is set and lock_timeout is not lower. A
// session ended by idle_in_transaction_session_timeout is the failure of
// the handler call that kept the transaction idle (*IdleTxError). Errors
// that say the database as a whole cannot take the batch, as during a
// primary switch (connection refused or lost, read-only 25006, starting
// up 57P03, shutting down 57P01), roll the batch back and deliver it again
// after a backoff (*UnavailableError in BatchStats.Err), with no attempt
// counted; a COMMIT that lost its reply is resolved as above. At
// start-up, a pool with fewer connections than Concurrency (plus one for
// the strategy's background work) is reported with the numbers.
//
// # Optional interfaces of a source
//
// A Source may also implement the interfaces below (the strategy's are
// listed in package dedupe's documentation). New finds them once, with the
// strategy's, and each source of this module asserts the ones it
// implements at compile time (var _ consumer.ExhaustionSource =
// (*Source)(nil)), so that a drifting signature fails to build instead of
// silently turning a feature off.
//
//   - TxSource (sources/kafka, for its offsets kept in Postgres):
//     BeforeCommit runs in every batch transaction after the batch's
//     messages were settled in it; an error wrapping ErrFenced rolls the
//     batch back and drops it, since another consumer owns the lane.
//   - PipelineSource (sources/kafka): a lane's next batch is handed out
//     while its last one commits; the next one claims meanwhile (unless
//     the strategy is sequenced) and runs its handlers once the last one
//     committed, or rolls back and is delivered again after it.
//   - HorizonSource (sources/kafka: the topics' retention; sources/sqs: the
//     queue's retention period): at start-up the consumer warns when the
//     strategy's retention (dedupe.Retainer) is shorter, since a message
//     redelivered after its marker expired would be applied again.
//   - ContentIDSource (sources/sqs, on a FIFO queue with content-based
//     deduplication): at start-up the consumer warns when the strategy's
//     retention is longer than the broker's deduplication window, since a
//     deliberate resend of the same payload would be dropped.
//   - ExhaustionSource (sources/sqs with UseQueueRedrive): when
//     ParkExhausted is false, a message whose attempts are used up is not
//     parked but handed back, for the broker's dead-letter queue to take.
//   - dedupe.Migrator (sources/kafka, for its offsets table): Migrations and
//     Migrate include its migration lines.
//
// Hooks are resolved the same way: a Hook that is also a BatchStartHook or
// a MessageHook gets those calls too.
//
// Package consumertest provides an in-memory at-least-once broker for tests.
package consumer
