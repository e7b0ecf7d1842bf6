package sqs_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/sources/sqs"
)

// Run both side by side, one op per message:
//
//	go test -run '^$' -bench 'Throughput' -benchtime 20000x ./sources/sqs
//
// BenchmarkThroughput/plain is a bare receive-and-delete-batch loop doing no
// Postgres work; BenchmarkThroughput/pipeline is the Source feeding the
// consumer engine (idset strategy, one unnest insert of effects per batch)
// into Postgres, timed until every message is deleted. Both use 4 receivers.

func BenchmarkThroughput(b *testing.B) {
	b.Run("plain", benchPlain)
	b.Run("pipeline", benchPipeline)
}

func benchQueue(b *testing.B) (*awssqs.Client, string) {
	c := fauxqs.Client(b)
	queue := fauxqs.NewQueue(b, c, "bench", nil)
	b.StopTimer()
	sendBench(b, c, queue, b.N)
	b.StartTimer()
	return c, queue
}

func sendBench(b *testing.B, c *awssqs.Client, queue string, n int) {
	msgs := keyed("m", n)
	var wg sync.WaitGroup
	per := (n + 7) / 8
	for w := 0; w*per < n; w++ {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			send(b, c, queue, msgs[lo:hi])
		}(w*per, min((w+1)*per, n))
	}
	wg.Wait()
}

func benchPlain(b *testing.B) {
	c, queue := benchQueue(b)
	var done atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done.Load() < int64(b.N) {
				out, err := c.ReceiveMessage(context.Background(), &awssqs.ReceiveMessageInput{
					QueueUrl: aws.String(queue), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
					MessageSystemAttributeNames: systemAttrs, MessageAttributeNames: []string{"All"},
				})
				if err != nil {
					b.Error(err)
					return
				}
				if len(out.Messages) == 0 {
					continue
				}
				req := &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(queue)}
				for i, m := range out.Messages {
					req.Entries = append(req.Entries, types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
				}
				if _, err := c.DeleteMessageBatch(context.Background(), req); err != nil {
					b.Error(err)
					return
				}
				done.Add(int64(len(out.Messages)))
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

var systemAttrs = []types.MessageSystemAttributeName{types.MessageSystemAttributeNameApproximateReceiveCount, types.MessageSystemAttributeNameSentTimestamp}

func benchPipeline(b *testing.B) {
	c, queue := benchQueue(b)
	b.StopTimer()
	e := newE2E(b, queue)
	src, err := sqs.New(context.Background(), sqs.Config{Client: c, QueueURL: queue, Receivers: 4, WaitTime: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	cons := e.consumer(src, consumer.Config{BatchSize: 100, Concurrency: 4})
	b.StartTimer()
	began := time.Now()
	r := consumertest.Start(cons)
	for src.Stats().Deleted < int64(b.N) {
		time.Sleep(2 * time.Millisecond)
	}
	elapsed := time.Since(began)
	b.StopTimer()
	r.Stop(b)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}
