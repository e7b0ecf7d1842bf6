package consumer

import (
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/internal/pgerr"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5/pgconn"
)

var (
	// ErrFenced is returned (wrapped) by a TxSource whose lane now belongs to
	// another consumer; the batch rolls back and is dropped.
	ErrFenced = errors.New("consumer: lane fenced by a newer owner")
	// ErrPermanent is matched by errors made with Permanent.
	ErrPermanent = errors.New("consumer: permanent failure")
	// ErrInvalidConfig is matched by every error New returns for a bad
	// Config. It is pg.ErrInvalidConfig, matched by the configuration
	// errors of every package of the library.
	ErrInvalidConfig = pg.ErrInvalidConfig
	// ErrSourceDone is returned (wrapped) by the Fetch of a finite source,
	// such as a replay of a fixed range, once every message it holds was
	// handed out and settled, and none awaits redelivery. Run then lets the
	// batches in flight settle and returns nil.
	ErrSourceDone = errors.New("consumer: source is done")
	// ErrShutdownTimeout is matched by the error Run returns when batches
	// were still in flight Config.ShutdownTimeout after its context was
	// done: their handlers did not return. Their messages were not
	// acknowledged and are delivered again.
	ErrShutdownTimeout = errors.New("consumer: shutdown timeout")
)

// Permanent marks err as permanent: the message is parked at once instead of
// being retried. errors.Is(Permanent(err), err) holds.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string        { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error        { return e.err }
func (e *permanentError) Is(target error) bool { return target == ErrPermanent }

// IsPermanent reports whether err should park its message without retries.
// Errors made with Permanent are permanent, and so are payloads that cannot
// be decoded (*DecodeError). A *PanicError is not: a panic is retried, since
// the fix may be deployed before the attempts run out.
func IsPermanent(err error) bool {
	var de *DecodeError
	return errors.Is(err, ErrPermanent) || errors.As(err, &de)
}

// DecodeError reports a payload the handler could not decode. It is permanent.
type DecodeError struct {
	Err error
}

func (e *DecodeError) Error() string { return "decode payload: " + e.Err.Error() }
func (e *DecodeError) Unwrap() error { return e.Err }

// PanicError is the error a handler's panic turns into.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.Value) }

// ConfigError reports a bad Config value, with Package "consumer". It is
// the library's one configuration error, pg.ConfigError.
type ConfigError = pg.ConfigError

// ParkedError is the error MessageHook.MessageDone receives for a parked
// message: why it was parked (one of the parked.Reason constants) and the
// error that led there, if any.
type ParkedError struct {
	Reason string
	Err    error
}

func (e *ParkedError) Error() string {
	if e.Err == nil {
		return "parked: " + e.Reason
	}
	return "parked (" + e.Reason + "): " + e.Err.Error()
}

func (e *ParkedError) Unwrap() error { return e.Err }

// TransientError is the error a handler's statement got from the database
// for a reason that passes and is no fault of its message: a lock held
// elsewhere past lock_timeout (SQLSTATE 55P03), a serialization failure
// (40001) or a deadlock (40P01). The message is handed back and retried
// with backoff, the delivery is not counted against Config.MaxAttempts, and
// it is never parked for it. MessageHook.MessageDone sees it as the Err of
// an OutcomeRetried event.
type TransientError struct {
	Err error
}

func (e *TransientError) Error() string {
	return "transient database error, retried without counting an attempt: " + e.Err.Error()
}

func (e *TransientError) Unwrap() error { return e.Err }

// TimeoutError is the error a message gets when one of its handler's
// statements ran past the server's statement_timeout (SQLSTATE 57014): the
// statement's own work was too slow, which is the message's failure. It
// counts as an attempt, and the message is parked (reason max_attempts)
// when its attempts are used up. Setting names the server setting; Timeout
// is its value as the consumer read it at start-up (0 if unknown, or set
// inside the transaction).
type TimeoutError struct {
	Setting string
	Timeout time.Duration
	Err     error
}

func (e *TimeoutError) Error() string {
	if e.Timeout > 0 {
		return fmt.Sprintf("%s (%s) exceeded by the handler's statement: %v", e.Setting, e.Timeout, e.Err)
	}
	return fmt.Sprintf("%s exceeded by the handler's statement: %v", e.Setting, e.Err)
}

func (e *TimeoutError) Unwrap() error { return e.Err }

// classifyHandlerErr is the one place that decides what a database error a
// handler returned means for its message: transient (a *TransientError),
// its own timeout (a *TimeoutError), or, as returned, a failure of the
// message's. Errors that mean the database as a whole cannot take the
// batch now (read-only, starting up, shutting down, a connection lost)
// are taken before this, by dbUnavailable: they abandon the whole batch.
func (c *Consumer) classifyHandlerErr(err error) error {
	var (
		pe *pgconn.PgError
		te *TransientError
		to *TimeoutError
		ie *IdleTxError
	)
	if errors.As(err, &te) || errors.As(err, &to) || errors.As(err, &ie) || !errors.As(err, &pe) || IsPermanent(err) {
		return err
	}
	if pgerr.Unavailable(pe.Code) {
		// Where the batch was not abandoned for it (a QueueHandler's
		// statement), the message is retried all the same.
		return &TransientError{Err: err}
	}
	switch pe.Code {
	case "55P03", // lock_not_available: lock_timeout, or NOWAIT
		"40001", // serialization_failure
		"40P01": // deadlock_detected
		return &TransientError{Err: err}
	case "57014": // query_canceled: statement_timeout, or a cancel request
		return &TimeoutError{Setting: "statement_timeout", Timeout: c.server.statementTimeout, Err: err}
	case "25P03": // idle_in_transaction_session_timeout: the server ended the session
		return &IdleTxError{Timeout: c.idleTx, Err: err}
	}
	return err
}

// IsTransient reports whether err is a *TransientError: a failure of the
// database's that does not count against the message's attempts.
func IsTransient(err error) bool {
	var te *TransientError
	return errors.As(err, &te)
}
