package sqs_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/sources/sqs"
)

// outgoing is one message a test sends.
type outgoing struct {
	Body     string
	Attrs    map[string]string // string message attributes
	Group    string            // FIFO MessageGroupId
	DedupeID string            // FIFO MessageDeduplicationId
}

// send sends msgs with SendMessageBatch, ten at a time.
func send(tb testing.TB, c *awssqs.Client, queue string, msgs []outgoing) {
	tb.Helper()
	ctx := context.Background()
	for start := 0; start < len(msgs); start += 10 {
		req := &awssqs.SendMessageBatchInput{QueueUrl: aws.String(queue)}
		for i, m := range msgs[start:min(start+10, len(msgs))] {
			e := types.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(m.Body)}
			if len(m.Attrs) > 0 {
				e.MessageAttributes = map[string]types.MessageAttributeValue{}
				for k, v := range m.Attrs {
					e.MessageAttributes[k] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
				}
			}
			if m.Group != "" {
				e.MessageGroupId = aws.String(m.Group)
			}
			if m.DedupeID != "" {
				e.MessageDeduplicationId = aws.String(m.DedupeID)
			}
			req.Entries = append(req.Entries, e)
		}
		out, err := c.SendMessageBatch(ctx, req)
		if err != nil {
			tb.Fatalf("send: %v", err)
		}
		if len(out.Failed) > 0 {
			tb.Fatalf("send: %d entries failed: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
		}
	}
}

// newSource makes a Source on queue with cfg, closed at the end of the test.
func newSource(tb testing.TB, c *awssqs.Client, queue string, cfg sqs.Config) *sqs.Source {
	tb.Helper()
	cfg.Client = c
	cfg.QueueURL = queue
	src, err := sqs.New(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("sqs.New: %v", err)
	}
	tb.Cleanup(func() { _ = src.Close() })
	return src
}

// fetch calls Fetch with a deadline, failing the test when it runs out.
func fetch(tb testing.TB, src *sqs.Source, max int) *consumer.Batch {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := src.Fetch(ctx, max)
	if err != nil {
		tb.Fatalf("Fetch: %v", err)
	}
	if len(b.Messages) == 0 {
		tb.Fatalf("Fetch returned an empty batch")
	}
	for _, m := range b.Messages {
		if m.Lane != b.Lane {
			tb.Fatalf("batch of lane %s holds a message of lane %s", b.Lane, m.Lane)
		}
	}
	return b
}

// settle settles b, failing the test on error.
func settle(tb testing.TB, src *sqs.Source, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) {
	tb.Helper()
	if err := src.Settle(context.Background(), b, ack, retry); err != nil {
		tb.Fatalf("Settle: %v", err)
	}
}

// queueDepth returns the visible and in-flight message counts of queue.
func queueDepth(tb testing.TB, c *awssqs.Client, queue string) (visible, inFlight int) {
	tb.Helper()
	out, err := c.GetQueueAttributes(context.Background(), &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(queue),
		AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
		},
	})
	if err != nil {
		tb.Fatalf("GetQueueAttributes: %v", err)
	}
	visible, _ = strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
	inFlight, _ = strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	return visible, inFlight
}

// expectEmpty fails unless queue holds no messages, visible or not.
func expectEmpty(tb testing.TB, c *awssqs.Client, queue string) {
	tb.Helper()
	if v, f := queueDepth(tb, c, queue); v != 0 || f != 0 {
		tb.Fatalf("queue holds %d visible and %d in-flight messages, want none", v, f)
	}
}

// receiveRaw receives with a plain client (no source) for up to wait.
func receiveRaw(tb testing.TB, c *awssqs.Client, queue string, wait time.Duration) []types.Message {
	tb.Helper()
	out, err := c.ReceiveMessage(context.Background(), &awssqs.ReceiveMessageInput{
		QueueUrl: aws.String(queue), MaxNumberOfMessages: 10, WaitTimeSeconds: int32(wait / time.Second),
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
	})
	if err != nil {
		tb.Fatalf("ReceiveMessage: %v", err)
	}
	return out.Messages
}

func bodies(msgs []*consumer.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = string(m.Value)
	}
	return out
}

func numbered(prefix string, n int, f func(i int, m *outgoing)) []outgoing {
	out := make([]outgoing, n)
	for i := range out {
		out[i].Body = fmt.Sprintf("%s-%d", prefix, i)
		if f != nil {
			f(i, &out[i])
		}
	}
	return out
}

// client returns the test's SQS client.
func client(tb testing.TB) *awssqs.Client { return fauxqs.Client(tb) }
