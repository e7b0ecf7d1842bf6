package consumer

import (
	"errors"
	"fmt"

	"github.com/effectively-once/effectively/dedupe"
)

var (
	// ErrFenced is returned (wrapped) by a TxSource whose lane now belongs to
	// another consumer; the batch rolls back and is dropped.
	ErrFenced = errors.New("consumer: lane fenced by a newer owner")
	// ErrPermanent is matched by errors made with Permanent.
	ErrPermanent = errors.New("consumer: permanent failure")
	// ErrInvalidConfig is matched by every error New returns for a bad
	// Config. It is dedupe.ErrInvalidConfig, matched by the configuration
	// errors of every package of the library.
	ErrInvalidConfig = dedupe.ErrInvalidConfig
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
// the library's one configuration error, dedupe.ConfigError.
type ConfigError = dedupe.ConfigError

// ParkedError is the error MessageHook.MessageDone receives for a parked
// message: why it was parked (one of the Reason constants) and the error
// that led there, if any.
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
