package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/internal/pgerr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// commitKind says what a failed COMMIT means for the batch.
type commitKind uint8

const (
	// commitTransient: the server refused the commit for a reason that
	// passes (a serialization failure, a deadlock, a timeout, a shortage of
	// resources): nothing committed, and the batch is delivered again after
	// a backoff, as after any infrastructure failure.
	commitTransient commitKind = iota + 1
	// commitRefused: the server refused the commit because of what the
	// batch wrote (a deferred constraint or constraint trigger): nothing
	// committed, and the message that makes it fail is found and retried
	// or parked like a failing handler, so the rest of the batch commits.
	commitRefused
	// commitUnknown: the connection was lost while the COMMIT was on its
	// way or its answer was: the batch may or may not have committed.
	// Redelivery settles it (a duplicate if it committed).
	commitUnknown
)

// commitError is a failed COMMIT, classified.
type commitError struct {
	kind commitKind
	err  error
}

func (e *commitError) Error() string {
	if e.kind == commitUnknown {
		return "commit outcome unknown: " + e.err.Error()
	}
	return "commit: " + e.err.Error()
}

func (e *commitError) Unwrap() error { return e.err }

// classifyCommit decides what a COMMIT's error means, by the one rule the
// Idempotency-Key middleware shares (pgerr.Classify). The consumer owns no
// table a COMMIT can be refused on (its claims do not raise on a
// conflict), so every refusal is the batch's writes.
func classifyCommit(err error) *commitError {
	switch pgerr.Classify(err) {
	case pgerr.Lost:
		return &commitError{kind: commitUnknown, err: err}
	case pgerr.Passing:
		return &commitError{kind: commitTransient, err: err}
	default:
		return &commitError{kind: commitRefused, err: err}
	}
}

// commitTx commits tx and classifies a failure. A transaction whose
// connection was gone, or whose context was done, before COMMIT was sent
// certainly rolled back.
func commitTx(ctx context.Context, tx pgx.Tx) error {
	if conn := tx.Conn(); conn != nil && conn.IsClosed() {
		return &commitError{kind: commitTransient, err: errors.New("connection lost before COMMIT")}
	}
	if err := ctx.Err(); err != nil {
		return &commitError{kind: commitTransient, err: fmt.Errorf("before COMMIT: %w", err)}
	}
	if err := tx.Commit(ctx); err != nil {
		if pgconn.SafeToRetry(err) && !errors.Is(err, pgconn.ErrConnClosed) {
			// Not a byte of the COMMIT went out (its write failed at
			// once, or the context ended first): the server cannot have
			// committed. A worker stalled past IdleTxTimeout before its
			// COMMIT meets this when the server closed the session over
			// a Unix socket (over TCP it reads the server's 25P03). A
			// "conn closed" also claims to be safe to retry, but pgx
			// returns it when the connection broke while the COMMIT's
			// reply was read: that COMMIT may have committed.
			return &commitError{kind: commitTransient, err: fmt.Errorf("%w: %w", errCommitNotSent, err)}
		}
		return classifyCommit(err)
	}
	return nil
}

// errCommitNotSent is the error of a batch whose COMMIT could not be sent:
// it rolled back.
var errCommitNotSent = errors.New("COMMIT not sent, the batch did not commit")

// idleErr is the failure recorded for a handler call that returned err
// after lasting longer than idle, when tx's connection is gone: the server
// most likely ended the session because the call kept the transaction idle
// (idle_in_transaction_session_timeout); the client often sees only a
// broken pipe.
func idleErr(tx pgx.Tx, err error, took, idle time.Duration) error {
	if idle <= 0 || took <= idle {
		return err
	}
	if conn := tx.Conn(); conn != nil && conn.IsClosed() {
		return &IdleTxError{Timeout: idle, Err: err}
	}
	return err
}

// UnavailableError is the error that abandons a batch when a handler's
// statement found the database unable to take it (read-only, starting up,
// shutting down, out of connections or disk, the connection lost), as
// during a primary switch. The batch is rolled back and delivered again
// after a backoff, no attempt of its messages is counted, and none is
// parked for it. BatchStats.Err holds it.
type UnavailableError struct {
	Err error
}

func (e *UnavailableError) Error() string {
	return "database unavailable, batch delivered again: " + e.Err.Error()
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// checkDeferred runs the deferred constraints and constraint triggers on
// what the transaction has written so far, the checks COMMIT would run, and
// returns their error. It leaves the constraints' mode as it was and their
// checks still due at COMMIT: SET CONSTRAINTS runs under a savepoint that is
// rolled back, which restores the mode and marks the checks pending again.
// It is called only while isolating a batch whose COMMIT was refused.
func checkDeferred(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, "SAVEPOINT effectively_check; SET CONSTRAINTS ALL IMMEDIATE; ROLLBACK TO SAVEPOINT effectively_check; RELEASE SAVEPOINT effectively_check")
	if err != nil {
		return &CommitCheckError{Err: err}
	}
	return nil
}

// CommitCheckError is the error a message gets when the COMMIT of its batch
// was refused and the check of deferred constraints (SET CONSTRAINTS ALL
// IMMEDIATE) after its handler failed: its writes violate a deferred
// constraint or constraint trigger. It is retried like a handler error, and
// parked when its attempts are used up.
type CommitCheckError struct {
	Err error
}

func (e *CommitCheckError) Error() string {
	return fmt.Sprintf("deferred constraint check failed: %v", e.Err)
}

func (e *CommitCheckError) Unwrap() error { return e.Err }

// connLost returns an infrastructure error when err came with the loss of
// tx's connection (the server terminated the session, the network broke):
// that is no fault of the message whose handler saw it, so the batch is
// abandoned and delivered again without counting an attempt.
//
// A handler call that lasted longer than idle may have kept the transaction
// idle for longer than IdleTxTimeout, so that the server ended the session
// (the client often sees only a broken pipe): that is the handler's
// failure, and counts as an attempt, or a handler that always waits that
// long would be retried for ever.
//
// A database that cannot take the batch now (see pgerr.Unavailable: a
// read-only server after a switch, one starting up or shutting down, a
// connection lost, no connection slot left) is no fault of the message
// either, whatever the handler's call took.
func connLost(tx pgx.Tx, err error, took, idle time.Duration) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pgerr.Unavailable(pe.Code) {
		return &UnavailableError{Err: err}
	}
	if idle > 0 && took > idle {
		return nil
	}
	if conn := tx.Conn(); conn != nil && conn.IsClosed() {
		return fmt.Errorf("connection lost: %w", err)
	}
	return nil
}

// IdleTxError is the failure recorded for a message whose handler call
// lasted longer than Config.IdleTxTimeout when the batch then lost its
// connection before its commit: the server most likely ended the session
// because the transaction stayed idle for too long.
type IdleTxError struct {
	Timeout time.Duration
	Err     error
}

func (e *IdleTxError) Error() string {
	return fmt.Sprintf("idle_in_transaction_session_timeout: the handler kept the transaction idle for longer than IdleTxTimeout or the server's idle_in_transaction_session_timeout (%s), and the server ended the session: %v", e.Timeout, e.Err)
}

func (e *IdleTxError) Unwrap() error { return e.Err }

// commit is the last stage of a pass: the parked rows and the source's
// state are written in tx, which then commits; the strategy learns what
// committed.
func (c *Consumer) commit(ctx context.Context, tx pgx.Tx, b *Batch, items []*item, st *BatchStats) error {
	t := time.Now()
	var park []parkRow
	var ack []*Message // only a transactional source is told of them
	if c.txsrc != nil {
		ack = make([]*Message, 0, len(items))
	}
	for _, it := range items {
		if it.outcome == OutcomeParked {
			park = append(park, parkRow{it: it, reason: it.reason, err: it.err, hasMarker: it.hasMarker})
		}
		if it.outcome != OutcomeRetried && c.txsrc != nil {
			ack = append(ack, it.m)
		}
	}
	if err := c.insertParked(ctx, tx, park); err != nil {
		return fmt.Errorf("park: %w", err)
	}
	if c.txsrc != nil {
		if err := c.txsrc.BeforeCommit(ctx, tx, b, ack); err != nil {
			return fmt.Errorf("source: %w", err)
		}
	}
	if err := commitTx(ctx, tx); err != nil {
		return err
	}
	st.Commit += time.Since(t)
	if c.standbys == nil { // else once the standbys confirmed it (settle)
		c.committedItems(items)
	}
	return nil
}

// committedItems tells the strategy which verdicts of items committed.
func (c *Consumer) committedItems(items []*item) {
	if c.committer == nil {
		return
	}
	keys := make([]dedupe.Key, 0, len(items))
	verdicts := make([]dedupe.Verdict, 0, len(items))
	for _, it := range items {
		if it.verdict == 0 || it.verdict == dedupe.VerdictGap || it.outcome == OutcomeRetried {
			continue
		}
		keys = append(keys, it.key)
		verdicts = append(verdicts, it.verdict)
	}
	c.committed(keys, verdicts)
}
