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

// Source delivers messages at least once. Every source keeps the contract
// below, which the conformance suite in package consumer/sourcetest checks;
// a source's documentation says where its broker makes it fall short.
//
// # Fetching
//
// Fetch blocks until it can return a non-empty batch of at most max
// messages of one lane, or an error, or ctx is done (it then returns ctx's
// error). It never returns a nil or empty batch without an error. The
// consumer calls Fetch from Config.Concurrency goroutines at once. A source
// must never hand out a batch of a lane while an earlier batch of that lane
// is still being processed (fetched, not yet settled), which is what keeps
// lanes in order while lanes run in parallel.
//
// A finite source (a replay of a fixed range, say) signals that it is done
// by returning ErrSourceDone from Fetch once it will deliver nothing more:
// every message it delivered was acknowledged and none awaits a retry.
//
// # Settling
//
// Every batch Fetch returns is settled by exactly one call of Settle, after
// the batch's transaction committed or rolled back. Ack lists the messages
// whose outcome committed (applied, duplicate or parked): the source must
// not deliver them again, except after a crash. Retry lists the messages it
// must deliver again, each after its delay. Messages in neither list were
// abandoned (the consumer is shutting down or lost the lane): the source
// delivers them again as it would after a crash.
//
// Settle frees the batch's lane whatever it returns. It returns nil when
// the outcome reached the broker, and also when the batch is no longer the
// source's to settle: its lane was lost (revoked, fenced, the source was
// closed or the broker crashed) or it was settled already. Its messages are
// then delivered again, to this consumer or to the lane's new owner, as
// after a crash, and nothing the caller could do would change that. Settle
// returns an error only when an acknowledgement, or a retry's delay, may not
// have reached the broker: acknowledged messages may be delivered again
// (the strategy then finds them duplicates), and a retried one may come
// back later than asked. The transaction has committed either way, so the
// error is for logs and metrics, and the batch must not be settled again.
// A source that acknowledges asynchronously (Kafka's offset commits) need
// not report such failures through Settle. Settling a batch that came from
// another source is an error.
//
// # Order within a lane
//
// A lane is a Kafka partition, an SQS FIFO message group, or a receiver of
// an SQS standard queue (such a queue keeps no order, so neither do its
// lanes). Within an ordered lane:
//
//   - messages are delivered for the first time in lane order;
//   - a message handed back is delivered again once it is due (a retried
//     message when its delay is over, an abandoned one at once, or when the
//     broker's visibility timeout runs out), before any message of its lane
//     that was not delivered yet, and messages due together come in lane
//     order;
//   - while a retried message waits out its delay, a source either goes on
//     with the later messages of its lane (Kafka, consumertest.Broker) or
//     holds them back until the retried one was delivered again (an SQS
//     FIFO group, which the broker blocks): the consumer must work with
//     both.
//
// A broker may also deliver a message twice on its own (an SQS standard
// queue, a consumer group rebalance); such a copy can come anywhere later.
//
// # Building a source
//
// Package consumer/lanes does the scheduling this contract asks for (order
// within a lane, one batch in flight per lane, delayed redelivery, bounded
// buffers, fairness across lanes), and every source of this module builds
// on it, so that a source only fetches from its broker and acknowledges to
// it: a goroutine of the source Reserves room, pulls from the broker and
// Adds what came under its lane; Fetch is lanes.Lanes.Next; Settle
// acknowledges to the broker and calls lanes.Lanes.Settle (the source
// redelivers retried and abandoned messages itself, as Kafka's does) or
// lanes.Lanes.Finish (the broker redelivers them, as SQS does once a
// visibility timeout runs out).
//
// # Messages
//
// Message.Ref identifies the stored message: no two messages a source holds
// at once share it, and every redelivery of a message carries the same Ref,
// also to another Source value after a restart. A producer that sends the
// same content twice makes two messages with two Refs; the dedupe key, not
// Ref, recognises the second.
//
// Message.Attempt counts the deliveries of the message, this one included:
// 1 at the first, and one more at every redelivery (after a retry, an
// abandon, a lost lane or a crash). Within one Source value it grows with
// every redelivery, so a message that keeps failing reaches
// Config.MaxAttempts. Whether the count survives a restart is up to the
// broker: a broker that keeps it (SQS's ApproximateReceiveCount) carries it
// on in another process, while a source whose broker keeps none (Kafka)
// starts again at 1. A broker's count may also include receives that never
// reached a consumer (an SQS message held in a buffer and handed back
// unprocessed).
//
// Message.Value is the payload byte for byte. A source that can tell a
// message without a value (a Kafka tombstone) from one with an empty value
// delivers the first as nil and the second as a non-nil empty slice; a
// source that cannot, or whose broker carries no empty values (SQS), says
// so in its documentation.
type Source interface {
	// Fetch blocks until it can return a non-empty batch of at most max
	// messages of one lane, or an error, or ctx is done.
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

// PipelineSource is implemented by a TxSource that can hand out a lane's
// next batch while the lane's last batch commits (sources/kafka). The
// consumer calls Pipeline when Run starts, to say that it calls
// AwaitPrevious and Recall as below; until then the source keeps to one
// batch in flight per lane as every Source does. After it, once
// BeforeCommit returned nil for a batch, the next batch of its lane may be
// fetched (by another of the consumer's goroutines, so only while fewer
// lanes are busy than Config.Concurrency), before the first has been
// settled. The handlers of the next batch still run only after the first
// committed, since they may read what it wrote:
//
//   - AwaitPrevious is called once in every pass over a batch, after its
//     claim and before its handlers, or, for a sequenced strategy (whose
//     claims and order depend on the commits before), before its claim.
//     It blocks until the batch handed out before b in its lane, if that
//     one is still to be settled, has been, and returns nil when nothing
//     that batch left undone concerns b (every message acknowledged, or
//     retried after a delay). Otherwise it returns an error (one wrapping
//     ErrFenced when the lane was lost): b's pass rolls back and b is
//     settled with nothing acknowledged, to be delivered again after the
//     messages before it.
//   - Recall is called before every pass over a batch after the first: a
//     batch whose BeforeCommit ran may not have committed and runs again,
//     so a batch handed out after it must roll back rather than wait for
//     it (its claims may hold what the new pass claims).
type PipelineSource interface {
	TxSource
	Pipeline()
	AwaitPrevious(ctx context.Context, b *Batch) error
	Recall(b *Batch)
}

// HorizonSource is implemented by sources that know how long after a
// delivery the same message can be delivered again (Kafka retention, SQS
// retention). The consumer asks at start-up and warns when its strategy's
// retention is shorter; when the source cannot say yet (an error), the
// consumer logs it and asks again in the background until it can.
type HorizonSource interface {
	RedeliveryHorizon(ctx context.Context) (time.Duration, error)
}

// ContentIDSource is implemented by sources whose default dedupe ID
// (Message.ID) can be derived from the payload alone, as on an SQS FIFO
// queue with content-based deduplication, where it is a hash of the body.
// Such a broker drops a repeated payload by itself only within
// ContentIDWindow (five minutes for SQS) and delivers a deliberate resend
// of the same payload after that, with the same ID: a strategy that keeps
// its markers longer then drops the resend as a duplicate. The consumer
// warns at start-up when its strategy's retention is longer than the
// window. ContentIDWindow returns 0 when IDs are not derived from payloads.
type ContentIDSource interface {
	ContentIDWindow() time.Duration
}

// ExhaustionSource is implemented by sources that can leave a message whose
// attempts are used up to the broker's own dead-letter mechanism (an SQS
// redrive policy). When ParkExhausted returns false, the consumer does not
// park such a message: it keeps handing it back, and the broker moves it
// aside. Permanent failures are still parked.
type ExhaustionSource interface {
	ParkExhausted() bool
}
