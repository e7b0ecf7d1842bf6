package fauxqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// Region is the region the test clients use.
const Region = "us-east-1"

// Client returns an SQS client for Endpoint with static test credentials.
func Client(tb testing.TB) *sqs.Client {
	tb.Helper()
	return NewClient(Endpoint(tb))
}

// NewClient returns an SQS client for endpoint with static test credentials
// (the emulator accepts any).
func NewClient(endpoint string) *sqs.Client {
	return sqs.New(sqs.Options{
		Region:       Region,
		BaseEndpoint: aws.String(endpoint),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
}

// NewQueue creates a queue with a unique name starting with prefix and
// returns its URL; the queue is deleted when the test ends. A name ending in
// ".fifo" makes a FIFO queue (FifoQueue is set for it).
func NewQueue(tb testing.TB, c *sqs.Client, prefix string, attrs map[string]string) string {
	tb.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	fifo := strings.HasSuffix(prefix, ".fifo")
	name := strings.TrimSuffix(prefix, ".fifo") + "-" + hex.EncodeToString(b)
	a := map[string]string{}
	for k, v := range attrs {
		a[k] = v
	}
	if fifo {
		name += ".fifo"
		a["FifoQueue"] = "true"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: a})
	if err != nil {
		tb.Fatalf("fauxqs: create queue %s: %v", name, err)
	}
	url := aws.ToString(out.QueueUrl)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = c.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
	})
	return url
}
