package consumer

import (
	"context"
	"errors"
	"runtime/debug"
	"time"

	"github.com/effectively-once/effectively/consumer/internal/merge"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The queued handle stage: what QueueHandlers queued is sent in pipelined
// round trips, and a failure is attributed to the message whose statement
// (or callback) failed.

// errUnattributed ends a pass whose queued statements failed in a way that
// names no single message: an argument of a statement queued by several
// messages could not be encoded. The next pass isolates every message, so
// that each one's statements are sent alone.
var errUnattributed = errors.New("a queued statement failed before it was sent, and several messages queued it")

// sendQueued sends the statements queued in qs (qs[i] is items[i]'s queue)
// in tx: those the handlers queued in one pipelined round trip, then those
// their callbacks queued in the next, until none is left; with mg, the
// statements of a Combiner combined (queue_combine.go) and, with inserts,
// runs of single-row INSERTs merged (consumer/internal/merge). It stops at
// the first failure and returns the message to blame with a
// *StatementError, or no message when none can be told: a lost connection,
// merge.ErrMerged, or errUnattributed (wrapping the error).
func sendQueued(ctx context.Context, tx pgx.Tx, items []*item, qs []*msgQueue, mg *merge.Merger, inserts bool) (*item, error) {
	defer func() {
		for _, q := range qs {
			q.done = true
		}
	}()
	var b pgx.Batch
	var owner []int
	for {
		b.QueuedQueries, owner = b.QueuedQueries[:0], owner[:0]
		for i, q := range qs {
			for _, qq := range q.pending {
				b.QueuedQueries = append(b.QueuedQueries, qq)
				owner = append(owner, i)
			}
			q.pending = nil
		}
		if len(owner) == 0 {
			return nil, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		wire, from := &b, []int(nil)
		if mg != nil {
			combineLast(b.QueuedQueries, owner)
			var sent []*pgx.QueuedQuery
			if sent, from = mg.Merge(b.QueuedQueries, inserts, combining{}); len(sent) < len(b.QueuedQueries) {
				wire = &pgx.Batch{QueuedQueries: sent}
			} else {
				from = nil
			}
		}
		k, err := sendRound(ctx, tx, wire)
		if err == nil {
			continue
		}
		if k < 0 {
			return nil, err
		}
		var pe pgx.ErrPreprocessingBatch
		if from != nil {
			// Merged: the statement sent stands for those queued from
			// from[k] on.
			end := len(owner)
			if k+1 < len(from) {
				end = from[k+1]
			}
			switch {
			case end-from[k] == 1 && !errors.As(err, &pe):
				k = from[k]
			case connClosed(tx) && !errors.As(err, &pe):
				return nil, err
			default:
				return nil, errors.Join(merge.ErrMerged, err)
			}
		}
		if errors.As(err, &pe) {
			// pgx failed before it sent anything: it names the statement's
			// text, not which of those with that text failed.
			return blameText(items, owner, &b, pe, err)
		}
		if conn := tx.Conn(); conn != nil && conn.IsClosed() {
			return nil, err // not the statement's fault
		}
		return items[owner[k]], &StatementError{SQL: b.QueuedQueries[k].SQL, Err: err}
	}
}

// sendRound sends b and reads its results, running each statement's
// callback. It returns the index of the statement whose result or callback
// failed first, with the error, or -1 with an error that came after every
// result was read.
func sendRound(ctx context.Context, tx pgx.Tx, b *pgx.Batch) (int, error) {
	br := tx.SendBatch(ctx, b)
	r := &results{BatchResults: br}
	for k, qq := range b.QueuedQueries {
		r.err, r.rows = nil, nil
		var err error
		if qq.Fn != nil {
			err = r.call(qq.Fn)
		} else {
			_, err = r.Exec()
		}
		if serr := r.statementErr(); err == nil {
			err = serr
		}
		if err != nil {
			// Close reads what is left without running the callbacks of
			// a batch whose pass is lost anyway.
			for _, rest := range b.QueuedQueries[k+1:] {
				rest.Fn = nil
			}
			_ = br.Close()
			return k, err
		}
	}
	if err := br.Close(); err != nil {
		return -1, err
	}
	return -1, nil
}

// blameText attributes a statement that pgx refused before sending the
// batch. A statement PostgreSQL could not prepare fails whoever queues its
// text: the first message that did is blamed. Arguments that could not be
// encoded are a message's own: that message is blamed if it alone queued
// the text, and otherwise no one is (errUnattributed).
func blameText(items []*item, owner []int, b *pgx.Batch, pe pgx.ErrPreprocessingBatch, err error) (*item, error) {
	var pg *pgconn.PgError
	prepare := errors.As(err, &pg)
	blame := -1
	for k, qq := range b.QueuedQueries {
		if qq.SQL != pe.SQL() {
			continue
		}
		switch {
		case blame < 0:
			blame = owner[k]
		case !prepare && owner[k] != blame:
			return nil, errors.Join(errUnattributed, err)
		}
	}
	if blame < 0 {
		return nil, errors.Join(errUnattributed, err)
	}
	return items[blame], &StatementError{SQL: pe.SQL(), Err: err}
}

// results hands one statement's result to the callback set on it (through
// pgx's QueuedQuery helpers, which read it with Exec, Query or QueryRow)
// and keeps the statement's own error, so that a callback that drops it
// cannot pass a failed statement for a good one.
type results struct {
	pgx.BatchResults
	err  error
	rows pgx.Rows
}

func (r *results) call(fn func(pgx.BatchResults) error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return fn(r)
}

func (r *results) Exec() (pgconn.CommandTag, error) {
	ct, err := r.BatchResults.Exec()
	r.err = err
	return ct, err
}

func (r *results) Query() (pgx.Rows, error) {
	rows, err := r.BatchResults.Query()
	r.rows, r.err = rows, err
	return rows, err
}

func (r *results) QueryRow() pgx.Row {
	rows, _ := r.Query()
	return row{rows}
}

// Close is not for callbacks: the consumer closes the batch.
func (r *results) Close() error {
	return errors.New("consumer: a queued statement's callback must not close the batch")
}

// statementErr is the statement's own error, once its rows are closed.
func (r *results) statementErr() error {
	if r.rows != nil {
		r.rows.Close()
		if err := r.rows.Err(); err != nil {
			return err
		}
	}
	return r.err
}

// row is pgx's QueryRow result, over the rows results keeps.
type row struct{ rows pgx.Rows }

func (r row) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// handleQueued is the fast handle stage for a QueueHandler: every new
// message's handler queues its statements, and they all go in one round
// trip (per round of callbacks). A handler error that parks its message
// parks it in this pass, since none of its statements ran: its marker
// commits with the parked row. Any other failure ends the pass
// (errHandlerFailed), recorded on the message it is attributed to.
func (c *Consumer) handleQueued(ctx context.Context, tx pgx.Tx, news []*item, merging bool) (slow []*item, err error) {
	t := time.Now()
	run := make([]*item, 0, len(news))
	qs := make([]*msgQueue, 0, len(news))
	slab := make([]msgQueue, len(news)) // one allocation for the batch's queues
	again := false
	for i, it := range news {
		it.runs++
		q := &slab[i]
		herr := callQueueIn(ctx, c.cfg.QueueHandler, it.m, q)
		switch {
		case herr == nil:
			run, qs = append(run, it), append(qs, q)
		default:
			c.recordFailure(it, herr)
			if !it.failedPark {
				again = true // its marker must not commit
			} else {
				c.parkFailed(it)
			}
		}
	}
	if again {
		return nil, errHandlerFailed
	}
	// The transaction was idle while the handlers ran.
	idle := c.idleTx
	slowHandlers := idle > 0 && time.Since(t) > idle
	var mg *merge.Merger
	if merging {
		mg = &c.merger
	}
	failed, err := sendQueued(ctx, tx, run, qs, mg, !c.cfg.NoInsertMerge)
	switch {
	case err == nil:
	case failed != nil:
		c.recordFailure(failed, err)
		return nil, errHandlerFailed
	case errors.Is(err, errUnattributed), errors.Is(err, merge.ErrMerged):
		return nil, err
	case slowHandlers && connClosed(tx):
		// Most likely the server ended the session while the handlers
		// kept the transaction idle; they all did.
		for _, it := range run {
			c.recordFailure(it, &IdleTxError{Timeout: idle, Err: err})
		}
		return nil, errHandlerFailed
	default:
		if lost := connLost(tx, err, 0, 0); lost != nil {
			return nil, lost
		}
		return nil, err
	}
	for _, it := range run {
		it.outcome = OutcomeApplied
	}
	if slowHandlers {
		slow = run
	}
	return slow, nil
}

// handleQueuedOne runs the QueueHandler for one message and sends its
// statements, under an isolating pass's savepoint. A statement pgx refused
// to send after it had sent others of the message left the connection
// closed: that is the message's failure, recorded here, and the pass ends
// (lost is errHandlerFailed).
func (c *Consumer) handleQueuedOne(ctx context.Context, tx pgx.Tx, it *item) (herr, lost error) {
	it.runs++
	q, herr := callQueue(ctx, c.cfg.QueueHandler, it.m)
	if herr != nil {
		return herr, nil
	}
	_, herr = sendQueued(ctx, tx, []*item{it}, []*msgQueue{q}, nil, false)
	var pe pgx.ErrPreprocessingBatch
	if herr != nil && errors.As(herr, &pe) && connClosed(tx) {
		c.recordFailure(it, herr)
		return herr, errHandlerFailed
	}
	return herr, nil
}

func connClosed(tx pgx.Tx) bool {
	conn := tx.Conn()
	return conn != nil && conn.IsClosed()
}
