package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/effectively-once/effectively/consumer"
	"github.com/jackc/pgx/v5"
)

// EmitQueued is EmitFor for a consumer's QueueHandler, which has no
// transaction but a queue: it queues on q the INSERT of msgs, which runs in
// the batch's transaction with the message's effect and dedupe marker. So
// the messages exist exactly when the effect does: a batch that rolls
// back emits nothing, and a duplicate, whose handler does not run, emits
// nothing either. A message without an ID gets ID(in, i), i being its
// position in msgs; call EmitQueued once per input, as EmitFor.
//
// The consumer sends the emits of a batch's messages as one INSERT of all
// their rows (the statement's argument is a consumer.Combiner), after the
// batch's other statements and in the same round trip: a QueueHandler
// that emits still costs one round trip per batch. The statement queued
// also runs alone, as a pgx.Batch runs it.
//
// EmitQueued checks every message before queueing anything, and returns a
// *MessageError (wrapping ErrInvalid) for the first it refuses; it queues
// nothing then. Returning that error from the handler parks the input
// once its attempts are used up; wrap it with consumer.Permanent to park
// it at once.
func (o *Outbox) EmitQueued(q consumer.Queue, in *consumer.Message, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	rs, err := o.rows(msgs, func(i int) string { return ID(in, i) })
	if err != nil {
		return err
	}
	q.Queue(o.sql, &queuedEmit{o: o, rows: rs})
	return nil
}

// queuedEmit is the argument of the statement EmitQueued queues: the
// statement's real arguments, and the way to join its rows with those of
// the batch's other emits into one statement.
type queuedEmit struct {
	o    *Outbox
	rows emitRows
}

var _ consumer.Combiner = (*queuedEmit)(nil)

// RewriteQuery gives the statement its arguments when it runs alone.
func (e *queuedEmit) RewriteQuery(_ context.Context, _ *pgx.Conn, sql string, _ []any) (string, []any, error) {
	return sql, e.o.args(&e.rows), nil
}

// Combine returns one emit of the rows of all, in their order.
func (e *queuedEmit) Combine(all []consumer.Combiner) (string, []any, error) {
	n := 0
	for _, c := range all {
		x, ok := c.(*queuedEmit)
		if !ok || x.o.sql != e.o.sql || x.o.cfg.Mode != e.o.cfg.Mode {
			return "", nil, errors.New("outbox: not an emit of the same outbox")
		}
		n += len(x.rows.ids)
	}
	if e.o.cfg.Mode != TableMode && n > maxLogEmit {
		return "", nil, fmt.Errorf("outbox: emit: %d messages in one batch, more than %d", n, maxLogEmit)
	}
	rs := emitRows{parts: make([]int32, 0, n), sinks: make([]string, 0, n), ids: make([]string, 0, n),
		keys: make([][]byte, 0, n), values: make([][]byte, 0, n), headers: make([][]byte, 0, n)}
	for _, c := range all {
		rs.append(&c.(*queuedEmit).rows)
	}
	return e.o.sql, e.o.args(&rs), nil
}
