package consumer

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Batch is what a Source hands out: messages of one lane, in lane order.
type Batch struct {
	// Lane identifies the lane the messages came from.
	Lane string
	// Messages are in lane order; the consumer may receive fewer than it asked for.
	Messages []*Message
	// SourceData belongs to the Source that made the batch.
	SourceData any
}

// Retry is a message handed back to its source for redelivery.
type Retry struct {
	Message *Message
	// Delay is how long the source waits before delivering it again.
	Delay time.Duration
}

// Source delivers messages at least once.
//
// The consumer calls Fetch from Config.Concurrency goroutines at once. A
// source must never hand out a batch of a lane while an earlier batch of that
// lane is still being processed (fetched, not yet settled), which is what
// keeps lanes in order while lanes run in parallel.
//
// Every batch Fetch returns is settled by exactly one call of Settle, after
// the batch's transaction committed or rolled back. Ack lists the messages
// whose outcome committed (applied, duplicate or parked): the source must
// not deliver them again, except after a crash. Retry lists the messages it
// must deliver again, each after its delay. Messages in neither list were
// abandoned (the consumer is shutting down or lost the lane): the source
// delivers them again as it would after a crash.
type Source interface {
	// Fetch blocks until it can return a non-empty batch of at most max
	// messages, or ctx is done.
	Fetch(ctx context.Context, max int) (*Batch, error)
	// Settle reports the outcome of a batch that Fetch returned.
	Settle(ctx context.Context, b *Batch, ack []*Message, retry []Retry) error
}

// TxSource is implemented by sources that write their own state in the
// batch transaction, such as Kafka offsets kept in Postgres. BeforeCommit runs
// inside the transaction after every message of the batch was settled in it;
// ack lists the messages about to be acknowledged. If it returns an error
// wrapping ErrFenced, the transaction rolls back and the batch is settled
// with nothing acknowledged or retried: another consumer owns the lane now.
type TxSource interface {
	Source
	BeforeCommit(ctx context.Context, tx pgx.Tx, b *Batch, ack []*Message) error
}

// HorizonSource is implemented by sources that know how long after a
// delivery the same message can be delivered again (Kafka retention, SQS
// retention). The consumer warns at start-up when its strategy's retention is
// shorter.
type HorizonSource interface {
	RedeliveryHorizon() time.Duration
}

// ExhaustionSource is implemented by sources that can leave a message whose
// attempts are used up to the broker's own dead-letter mechanism (an SQS
// redrive policy). When ParkExhausted returns false, the consumer does not
// park such a message: it keeps handing it back, and the broker moves it
// aside. Permanent failures are still parked.
type ExhaustionSource interface {
	ParkExhausted() bool
}
