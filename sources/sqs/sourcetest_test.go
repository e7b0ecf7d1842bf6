package sqs_test

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
	"github.com/effectively-once/effectively/consumer/sourcetest"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/sources/sqs"
)

// TestSourceConformance runs the source conformance suite against the
// emulator, on a standard queue (whose lanes are receivers, without order)
// and on a FIFO queue (whose lanes are message groups, held while a
// retried message waits). Dropped acknowledgements are DeleteMessageBatch
// calls that never reach the emulator.
func TestSourceConformance(t *testing.T) {
	t.Parallel()
	const visibility = 2 * time.Second
	harness := func(fifo bool) sourcetest.Harness {
		h := sourcetest.Harness{
			Lanes:           1,
			RedeliveryDelay: visibility + time.Second, // and a receive
			Features: sourcetest.Features{
				Unordered:              !fifo,
				HoldsLaneOnRetry:       fifo,
				NoEmptyValues:          true,
				AttemptsSurviveRestart: true,
			},
		}
		if fifo {
			h.Lanes = 3
		}
		h.New = func(t *testing.T) *sourcetest.Broker {
			c, w := newWire(t)
			prefix := "conformance"
			if fifo {
				prefix += ".fifo"
			}
			queue := fauxqs.NewQueue(t, c, prefix, nil)
			return &sourcetest.Broker{
				Publish: func(t *testing.T, lane int, msgs ...sourcetest.Message) {
					publishTagged(t, c, queue, fifo, lane, msgs)
				},
				Open: func(t *testing.T) consumer.Source {
					src, err := sqs.New(context.Background(), sqs.Config{
						Client: c, QueueURL: queue, Receivers: 2, WaitTime: time.Second,
						VisibilityTimeout: visibility, HeartbeatInterval: 500 * time.Millisecond,
						Logger: consumertest.Logger(),
					})
					if err != nil {
						t.Fatal(err)
					}
					return src
				},
				FailAcks: func(*testing.T) func() {
					w.drop.Store("DeleteMessageBatch")
					return func() { w.drop.Store("") }
				},
			}
		}
		return h
	}
	t.Run("Standard", func(t *testing.T) {
		t.Parallel()
		sourcetest.Run(t, harness(false))
	})
	t.Run("FIFO", func(t *testing.T) {
		t.Parallel()
		sourcetest.Run(t, harness(true))
	})
}

// publishTagged sends msgs with their headers as string attributes; on a
// FIFO queue to group g<lane>, deduplicated by their tag.
func publishTagged(t *testing.T, c *awssqs.Client, queue string, fifo bool, lane int, msgs []sourcetest.Message) {
	t.Helper()
	for start := 0; start < len(msgs); start += 10 {
		req := &awssqs.SendMessageBatchInput{QueueUrl: aws.String(queue)}
		for i, m := range msgs[start:min(start+10, len(msgs))] {
			e := types.SendMessageBatchRequestEntry{
				Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(string(m.Value)),
				MessageAttributes: map[string]types.MessageAttributeValue{},
			}
			for _, h := range m.Headers {
				e.MessageAttributes[h.Key] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(string(h.Value))}
			}
			if fifo {
				e.MessageGroupId = aws.String("g" + strconv.Itoa(lane))
				e.MessageDeduplicationId = aws.String(m.Tag())
			}
			req.Entries = append(req.Entries, e)
		}
		out, err := c.SendMessageBatch(context.Background(), req)
		if err != nil {
			t.Fatalf("send: %v", err)
		}
		if len(out.Failed) > 0 {
			t.Fatalf("send: %d entries failed: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
		}
	}
}
