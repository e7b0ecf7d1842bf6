package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime/debug"

	"github.com/jackc/pgx/v5"
)

// QueueHandler applies one new message's effect by queueing its statements
// on q instead of executing them. The consumer calls it once per new
// message, then sends the statements of the whole batch to PostgreSQL in one
// pipelined round trip, in the batch's order and, within a message, in the
// order they were queued. A batch of per-message statements so costs one
// round trip instead of one per message, while the handler stays written for
// one message.
//
// The statements run in the batch's transaction, with the message's dedupe
// marker. A message's statements are all or nothing: when one of them
// fails (or a callback set on it returns an error), the transaction rolls
// back and the batch runs again without that message, which is retried, or
// parked when the error is permanent or its attempts are used up. No other
// message is blamed: each statement is attributed to the message that
// queued it.
//
// To read a statement's result, set a callback on the *pgx.QueuedQuery that
// Queue returns (Exec, Query or QueryRow, as with a pgx.Batch). Callbacks
// run while the results come back, in order. A callback sees its
// statement's error (from rows.Err or Row.Scan) and may return it wrapped
// with Permanent to park the message at once; whatever it returns, a failed
// statement fails its message. A callback may queue further statements on
// the same q: they go in a next round trip, together with those the other
// messages' callbacks queued, so a handler that reads before it writes
// costs two round trips per batch, not two per message. q must not be used
// after the handler and its callbacks have returned.
//
// Single-row INSERTs are cheaper still: a run of INSERTs of the same text
// whose values are their parameters (INSERT INTO t (a, b) VALUES ($1, $2)),
// with no callback, queued one after the other (one per message, say), is
// sent as one multi-row INSERT of the same rows in the same order, unless
// Config.NoInsertMerge is set. Should it fail, the batch runs again with
// the statements as queued, to find the message to blame. A statement
// whose only argument is a Combiner (outbox.EmitQueued queues one) is
// joined with the like statements of the batch's other messages into one,
// sent after the batch's other statements, in the same round trip.
//
// Returning an error fails the message as for Handler; its queued
// statements are dropped unsent. An error made with Permanent (or a
// *DecodeError) parks the message without running the batch again.
//
// A QueueHandler can run more than once for one delivery of a message, as
// a Handler can: when a batch-mate fails, the batch's transaction rolls
// back and runs again without it, pipelined, up to four passes in all;
// should batch-mates still fail, the rest of the batch is then isolated
// message by message under savepoints. A healthy message of a
// deterministic handler so runs at most six times however many
// batch-mates fail (four pipelined passes, one more if a merged INSERT
// failed, and the isolating pass), and once when none does. Anything the handler does
// outside q happens again each time; BatchStats.Reruns counts these runs.
// Since the transaction waits while the batch's handlers run, a
// QueueHandler should not block (Config.IdleTxTimeout bounds the wait).
type QueueHandler func(ctx context.Context, q Queue, m *Message) error

// Queue is where a QueueHandler puts one message's statements. *pgx.Batch
// has this method, so a handler can be tested by queueing into a pgx.Batch.
type Queue interface {
	// Queue queues sql with its arguments and returns the queued statement,
	// on which a callback can be set to read its result.
	Queue(sql string, args ...any) *pgx.QueuedQuery
}

var _ Queue = (*pgx.Batch)(nil)

// JSONQueue adapts a queue handler of decoded payloads. A payload that does
// not decode into T is a permanent failure (*DecodeError): the message is
// parked with the decoding error, not retried.
func JSONQueue[T any](h func(ctx context.Context, q Queue, m *Message, v T) error) QueueHandler {
	return func(ctx context.Context, q Queue, m *Message) error {
		var v T
		if err := json.Unmarshal(m.Value, &v); err != nil {
			return &DecodeError{Err: err}
		}
		return h(ctx, q, m, v)
	}
}

// StatementError is the failure of a statement a QueueHandler queued, or of
// the callback set on it: the error its message fails with. It is
// permanent when Err is.
type StatementError struct {
	// SQL is the statement's text, without its arguments.
	SQL string
	// Err is the statement's error, or its callback's.
	Err error
}

func (e *StatementError) Error() string {
	const most = 120
	sql := e.SQL
	if len(sql) > most {
		sql = sql[:most] + "…"
	}
	return fmt.Sprintf("queued statement %q: %v", sql, e.Err)
}

func (e *StatementError) Unwrap() error { return e.Err }

// msgQueue is the Queue of one message during one pass.
type msgQueue struct {
	pending []*pgx.QueuedQuery
	// done is set once the message's statements were all sent and read:
	// a statement queued later could never run.
	done bool
	// first and slots hold the first statement and the first entries of
	// pending, so that a message that queues a statement or two costs no
	// allocation beyond its msgQueue.
	first     pgx.QueuedQuery
	firstUsed bool
	slots     [2]*pgx.QueuedQuery
}

func (q *msgQueue) Queue(sql string, args ...any) *pgx.QueuedQuery {
	if q.done {
		panic("consumer: Queue called after the message's statements were sent; queue statements only in the QueueHandler or in a callback of one of its statements")
	}
	qq := &q.first
	if q.firstUsed {
		qq = new(pgx.QueuedQuery)
	}
	q.firstUsed = true
	*qq = pgx.QueuedQuery{SQL: sql, Arguments: args}
	if q.pending == nil {
		q.pending = q.slots[:0]
	}
	q.pending = append(q.pending, qq)
	return qq
}

// callQueue runs the QueueHandler for one message and returns its queue,
// turning a panic into a *PanicError.
func callQueue(ctx context.Context, h QueueHandler, m *Message) (*msgQueue, error) {
	q := &msgQueue{}
	return q, callQueueIn(ctx, h, m, q)
}

// callQueueIn is callQueue with the queue given, a new one.
func callQueueIn(ctx context.Context, h QueueHandler, m *Message, q *msgQueue) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
		if err != nil {
			q.done = true // its statements are dropped
		}
	}()
	return h(ctx, q, m)
}
