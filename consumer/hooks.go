package consumer

import (
	"context"
	"time"
)

// Outcome is what became of one message in a batch.
type Outcome uint8

const (
	// OutcomeApplied: the handler ran and its effect committed with the marker.
	OutcomeApplied Outcome = iota + 1
	// OutcomeDuplicate: a marker already existed; nothing ran.
	OutcomeDuplicate
	// OutcomeMismatch: a marker existed with another payload fingerprint;
	// treated as a duplicate unless Config.OnMismatch parks it.
	OutcomeMismatch
	// OutcomeParked: the message now sits in the parked table.
	OutcomeParked
	// OutcomeRetried: the handler failed (or the sequence had a gap) and the
	// message was handed back for redelivery.
	OutcomeRetried
	// OutcomeUnknown: the connection was lost during the batch's COMMIT,
	// and the database could not be asked afterwards whether it committed
	// (see "Failures at COMMIT" in the package documentation). The message
	// is not acknowledged; its redelivery settles it (a duplicate if the
	// commit went through).
	OutcomeUnknown
)

// String returns the outcome's lower-case name.
func (o Outcome) String() string {
	switch o {
	case OutcomeApplied:
		return "applied"
	case OutcomeDuplicate:
		return "duplicate"
	case OutcomeMismatch:
		return "mismatch"
	case OutcomeParked:
		return "parked"
	case OutcomeRetried:
		return "retried"
	case OutcomeUnknown:
		return "unknown"
	}
	return "invalid"
}

// BatchInfo says which batch an event belongs to: the consumer that runs
// it, its strategy, its lane, and its number.
type BatchInfo struct {
	// Consumer is Config.Name.
	Consumer string
	// Strategy is the dedupe strategy's Name.
	Strategy string
	// Lane is the lane the batch was fetched from (a Kafka partition, an
	// SQS receiver or FIFO message group).
	Lane string
	// Batch numbers the consumer's batches from 1 in the order they start,
	// across all its lanes. It identifies a batch among the events of one
	// Consumer value; it starts again at 1 when the process restarts.
	Batch uint64
	// Size is the number of messages fetched.
	Size int
}

// BatchStats describes one finished batch.
type BatchStats struct {
	BatchInfo
	// Counts of outcomes. Gap counts the retried messages that had to wait
	// rather than failed: their sequence number was ahead of their sender's
	// mark, or an earlier message of their sender awaits a retry. They are
	// also in Retried.
	Applied, Duplicate, Mismatch, Parked, Retried, Gap int
	// Unknown counts the messages of a batch whose COMMIT lost its
	// connection and whose outcome could not be found out afterwards: they
	// may or may not have committed, and are delivered again (see
	// OutcomeUnknown). Err is then set too.
	Unknown int
	// CommitLost is true when the batch's COMMIT lost its reply (the
	// connection broke, the server ended the session, the context was
	// cancelled on the way) and the consumer then found out, on another
	// connection, whether it had committed: the outcomes reported are the
	// real ones, and Unknown is 0. Err is set when it had not committed.
	CommitLost bool
	// Isolated is true when a handler failed and the batch was re-run under
	// savepoints to isolate the failing messages.
	Isolated bool
	// Reruns counts the handler calls beyond the first for a message within
	// this batch (a healthy message re-run while a failing batch-mate is
	// isolated): their effects were rolled back, but anything the handler
	// did outside the transaction happened again.
	Reruns int
	// Fenced is true when the source reported that another consumer owns the
	// lane: the batch was rolled back and dropped.
	Fenced bool
	// StandbyUnconfirmed is true when Config.StandbyAck is on and the batch
	// was acknowledged after StandbyAck.Timeout although fewer standbys
	// than required had confirmed its commit: a failover to a standby that
	// lacks it now loses it.
	StandbyUnconfirmed bool
	// Err is the error that rolled back the whole batch, if any; its messages
	// were then handed back for redelivery. It matches standby.ErrUnconfirmed
	// when the batch committed but no standby could confirm it (see
	// standby.Config): its messages are reported as OutcomeUnknown.
	Err error
	// Durations of the phases: claiming keys, running handlers, commit,
	// acknowledging to the source, and the whole batch.
	Claim, Handle, Commit, Ack, Total time.Duration
	// Standby is the time the batch waited, after its commit, for the
	// standbys to confirm it (Config.StandbyAck); 0 when it is off.
	Standby time.Duration
}

// MessageEvent says what became of one message of a batch.
type MessageEvent struct {
	// BatchInfo is the batch the message was settled in.
	BatchInfo
	Message *Message
	Outcome Outcome
	// Err is the handler's or key's error for a retried message, and a
	// *ParkedError carrying the reason for a parked one; nil otherwise.
	Err error
}

// Hook observes the consumer, for metrics and tracing. Hooks run on the
// consumer's goroutines and should return quickly.
type Hook interface {
	// BatchDone is called after each batch was settled with its source.
	BatchDone(ctx context.Context, s *BatchStats)
}

// BatchStartHook is an optional Hook extension called when a batch starts,
// before its transaction begins. The context it returns (carrying a trace
// span, say) is used for the batch's work and passed to BatchDone and
// MessageDone.
type BatchStartHook interface {
	BatchStart(ctx context.Context, b BatchInfo) context.Context
}

// MessageHook is an optional Hook extension called once per message when
// its batch is done, after BatchDone. The messages of a batch rolled back
// as a whole (fenced, or failed) are not reported, except as OutcomeUnknown
// when its COMMIT lost its connection.
type MessageHook interface {
	MessageDone(ctx context.Context, e MessageEvent)
}
