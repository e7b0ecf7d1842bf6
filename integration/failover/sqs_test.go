package failover

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/standby"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/sources/sqs"
	"github.com/jackc/pgx/v5"
)

// The invariant workload through a failover with the SQS source, on the
// fauxqs emulator: an acknowledged message is deleted from the queue.

// sqsRun is a queue holding the workload.
type sqsRun struct {
	t     *testing.T
	p     *pair
	c     *awssqs.Client
	queue string
	h     *progress
	g     *gate
	ack   standby.Config // the consumer's Config.StandbyAck
}

// newSQSRun sends the workload: messages 0..N-1 with the idempotency-key
// attribute "k-i", every tenth sent twice (a producer's retry).
func newSQSRun(t *testing.T, p *pair) *sqsRun {
	t.Helper()
	c := fauxqs.Client(t)
	s := &sqsRun{t: t, p: p, c: c, queue: fauxqs.NewQueue(t, c, "failover", nil), h: newProgress(), g: newGate()}
	var entries []types.SendMessageBatchRequestEntry
	for i := range messages {
		e := types.SendMessageBatchRequestEntry{MessageBody: aws.String("v"),
			MessageAttributes: map[string]types.MessageAttributeValue{
				sqs.DefaultIDAttribute: {DataType: aws.String("String"), StringValue: aws.String("k-" + strconv.Itoa(i))},
			}}
		entries = append(entries, e)
		if i%10 == 0 {
			entries = append(entries, e)
		}
	}
	ctx := context.Background()
	for start := 0; start < len(entries); start += 10 {
		batch := entries[start:min(start+10, len(entries))]
		for i := range batch {
			batch[i].Id = aws.String(strconv.Itoa(i))
		}
		out, err := c.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: aws.String(s.queue), Entries: batch})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Failed) > 0 {
			t.Fatalf("send: %s", aws.ToString(out.Failed[0].Message))
		}
	}
	return s
}

// start runs a consumer of the queue.
func (s *sqsRun) start() *consumertest.Running {
	s.t.Helper()
	src, err := sqs.New(context.Background(), sqs.Config{
		Client: s.c, QueueURL: s.queue,
		WaitTime: time.Second, VisibilityTimeout: 2 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		Logger: logger(s.t),
	})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = src.Close() })
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		s.t.Fatal(err)
	}
	c := consumertest.NewConsumer(s.t, s.p.pool, src, consumer.Config{
		Name:      "ledger",
		Strategy:  strategy,
		BatchSize: batchSize,
		Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			s.g.pass(ctx)
			_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id) VALUES ($1)`, m.DedupeKey.ID)
			return err
		},
		RetryBackoff:    20 * time.Millisecond,
		MaxRetryBackoff: 100 * time.Millisecond,
		Hooks:           []consumer.Hook{s.h},
		StandbyAck:      s.ack,
		Logger:          logger(s.t),
	})
	return consumertest.Start(c)
}

// drained reports whether the queue holds no message, visible or in flight.
func (s *sqsRun) drained() bool {
	s.t.Helper()
	out, err := s.c.GetQueueAttributes(context.Background(), &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(s.queue),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible, types.QueueAttributeNameApproximateNumberOfMessagesDelayed},
	})
	if err != nil {
		s.t.Fatal(err)
	}
	for _, v := range out.Attributes {
		if v != "0" {
			return false
		}
	}
	return true
}

// waitDrained waits, batch by batch, until the queue is empty.
func (s *sqsRun) waitDrained() {
	s.t.Helper()
	timeout := time.After(time.Minute)
	for {
		s.h.mu.Lock()
		changed := s.h.changed
		s.h.mu.Unlock()
		if s.drained() {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			s.t.Fatal("the queue still holds messages after a minute")
		}
	}
}

// Synchronous replication with the SQS source: exactly one effect per
// message, the consumer going on through the switch.
func TestSQSSynchronousFailover(t *testing.T) {
	sqsSynchronous(t, startPair(t, true), standby.Config{})
}

// sqsSynchronous is TestSQSSynchronousFailover's run on the synchronous
// pair p, with the consumer's Config.StandbyAck set to ack.
func sqsSynchronous(t *testing.T, p *pair, ack standby.Config) {
	s := newSQSRun(t, p)
	s.ack = ack
	r := s.start()
	p.synchronousRun(s.h, s.g, func() {
		s.waitDrained()
		r.Stop(t)
	})
}

// Asynchronous replication with the SQS source: the messages of the
// commits the promoted standby lacks were deleted from the queue when they
// were acknowledged, so they are never applied: the loss that
// docs/failover.md describes.
func TestSQSAsynchronousFailoverLosesAcknowledged(t *testing.T) {
	p := startPair(t, false)
	s := newSQSRun(t, p)
	r := s.start()

	s.h.waitApplied(t, messages/4)
	cut, before := p.cutOff(s.h, s.g)
	promoted := p.killAndPromote(s.g)
	s.waitDrained()
	r.Stop(t)
	final := p.effects(p.s.standby())

	lost := 0 // committed on the primary, acknowledged, never applied again
	for id := range before {
		if final[id] == 0 {
			lost++
		}
	}
	_, unknown, errs := s.h.counts()
	t.Logf("N=%d (%d sent): %d effects on the primary at the kill, %d on the standby once promoted (cut off after %d applied), %d at the end: %d messages never applied, %d of them seen on the primary before the kill; %d batches rolled back by the switch, %d messages with an unknown COMMIT outcome",
		messages, messages+messages/10, rows(before), rows(promoted), cut, rows(final), messages-len(final), lost, errs, unknown)
	expectLoss(t, promoted, before)
	if lost == 0 || len(final) >= messages {
		t.Errorf("%d distinct messages applied of %d, %d committed only on the primary and missing: want a loss", len(final), messages, lost)
	}
	if d := twice(final); len(d) != 0 {
		t.Errorf("applied twice: %v", d)
	}
}
