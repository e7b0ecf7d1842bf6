package outbox

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Sink publishes messages to one destination (a Kafka topic, an SQS
// queue). The relay calls Publish with messages of one sink, in order: for
// each key, in commit order.
//
// Publish returns nil when every message was published. Otherwise it
// returns either a PublishErrors, which says which messages failed (the
// others were published), or any other error, which means none may have
// been. A failure is transient (retried with backoff) unless its error is
// wrapped with Permanent, in which case the message is parked.
//
// A Sink must send Message.ID along (Kafka: the IDHeader header), report a
// message published only once the destination acknowledged it, and keep
// the order of one key's messages within a call: once a message of a key
// failed, it must not send the key's later messages of the call (report
// them failed), or they would reach the destination ahead of it.
type Sink interface {
	Publish(ctx context.Context, msgs []Message) error
}

// PublishErrors maps the index of each message a Publish failed to its error.
type PublishErrors map[int]error

func (e PublishErrors) Error() string {
	idx := make([]int, 0, len(e))
	for i := range e {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	var b strings.Builder
	fmt.Fprintf(&b, "outbox: %d messages failed", len(e))
	for n, i := range idx {
		if n == 3 {
			b.WriteString("; …")
			break
		}
		fmt.Fprintf(&b, "; [%d] %v", i, e[i])
	}
	return b.String()
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as a refusal that retrying will not change (a message
// too large, an unknown topic): the relay parks the message with the error
// as the reason.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}
