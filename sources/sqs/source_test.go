package sqs_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/sources/sqs"
)

// quick is a configuration for tests: short polls and visibility timeouts.
func quick(cfg sqs.Config) sqs.Config {
	if cfg.WaitTime == 0 {
		cfg.WaitTime = time.Second
	}
	if cfg.VisibilityTimeout == 0 {
		cfg.VisibilityTimeout = 2 * time.Second
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = 500 * time.Millisecond
	}
	return cfg
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		cfg   sqs.Config
		field string
	}{
		{"no queue", sqs.Config{}, "QueueURL"},
		{"both queue forms", sqs.Config{QueueURL: "http://x/q", QueueName: "q"}, "QueueURL"},
		{"name as URL", sqs.Config{QueueURL: "orders"}, "QueueURL"},
		{"bad endpoint", sqs.Config{QueueName: "q", Endpoint: "localhost:4566"}, "Endpoint"},
		{"client and region", sqs.Config{QueueName: "q", Client: awssqs.New(awssqs.Options{}), Region: "eu-west-1"}, "Client"},
		{"negative receivers", sqs.Config{QueueName: "q", Receivers: -1}, "Receivers"},
		{"too many per receive", sqs.Config{QueueName: "q", MaxMessages: 11}, "MaxMessages"},
		{"wait too long", sqs.Config{QueueName: "q", WaitTime: 21 * time.Second}, "WaitTime"},
		{"wait not whole seconds", sqs.Config{QueueName: "q", WaitTime: 1500 * time.Millisecond}, "WaitTime"},
		{"visibility under a second", sqs.Config{QueueName: "q", VisibilityTimeout: 500 * time.Millisecond}, "VisibilityTimeout"},
		{"visibility over 12h", sqs.Config{QueueName: "q", VisibilityTimeout: 13 * time.Hour}, "VisibilityTimeout"},
		{"heartbeat as long as visibility", sqs.Config{QueueName: "q", VisibilityTimeout: 10 * time.Second, HeartbeatInterval: 10 * time.Second}, "HeartbeatInterval"},
		{"heartbeat without margin", sqs.Config{QueueName: "q", VisibilityTimeout: 10 * time.Second, HeartbeatInterval: 9800 * time.Millisecond}, "HeartbeatInterval"},
		{"negative heartbeat", sqs.Config{QueueName: "q", HeartbeatInterval: -time.Second}, "HeartbeatInterval"},
		{"negative buffer", sqs.Config{QueueName: "q", BufferSize: -1}, "BufferSize"},
		{"negative group batch", sqs.Config{QueueName: "q", GroupBatchSize: -1}, "GroupBatchSize"},
		{"no wait", sqs.Config{QueueName: "q", WaitTime: -time.Second}, "WaitTime"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sqs.New(context.Background(), tc.cfg)
			if !errors.Is(err, sqs.ErrInvalidConfig) || !errors.Is(err, consumer.ErrInvalidConfig) {
				t.Fatalf("New: got %v, want an invalid config error", err)
			}
			var ce *sqs.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field || ce.Package != "sqs" {
				t.Fatalf("New: got %v, want an error about %s", err, tc.field)
			}
			if !strings.HasPrefix(err.Error(), "sqs: invalid config: "+tc.field+": ") {
				t.Fatalf("New: got %q, want it to name the field", err)
			}
		})
	}
}

// TestDefaultChain builds the client from the AWS default configuration
// chain (credentials from the environment) with an endpoint override, and
// finds the queue by name.
func TestDefaultChain(t *testing.T) {
	c := client(t)
	queue := fauxqs.NewQueue(t, c, "chain", nil)
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")

	name := queue[strings.LastIndex(queue, "/")+1:]
	_, err := sqs.New(context.Background(), sqs.Config{QueueName: name, Endpoint: fauxqs.Endpoint(t)})
	var ce *sqs.ConfigError
	if !errors.As(err, &ce) || ce.Field != "Region" {
		t.Fatalf("New without a region: got %v, want an error about Region", err)
	}
	src, err := sqs.New(context.Background(), quick(sqs.Config{QueueName: name, Region: fauxqs.Region, Endpoint: fauxqs.Endpoint(t)}))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer src.Close()
	if src.QueueURL() != queue {
		t.Fatalf("QueueURL = %q, want %q", src.QueueURL(), queue)
	}
	send(t, c, queue, numbered("chain", 1, nil))
	b := fetch(t, src, 10)
	settle(t, src, b, b.Messages, nil)
	expectEmpty(t, c, queue)
}

// TestFetchSettleDeletes receives everything sent, in batches of one lane
// each, and deletes exactly what was acknowledged.
func TestFetchSettleDeletes(t *testing.T) {
	t.Parallel()
	c := client(t)
	queue := fauxqs.NewQueue(t, c, "basic", nil)
	src := newSource(t, c, queue, quick(sqs.Config{Receivers: 2}))
	const n = 45
	send(t, c, queue, numbered("m", n, nil))

	seen := map[string]bool{}
	for len(seen) < n {
		b := fetch(t, src, 7)
		if len(b.Messages) > 7 {
			t.Fatalf("batch of %d messages, asked for at most 7", len(b.Messages))
		}
		if !strings.HasPrefix(b.Lane, "receiver/") {
			t.Fatalf("lane %q, want a receiver lane", b.Lane)
		}
		for _, m := range b.Messages {
			if seen[string(m.Value)] {
				t.Fatalf("%s delivered twice", m.Value)
			}
			seen[string(m.Value)] = true
			if m.Source != "sqs" || m.Ref == "" || m.ID != m.Ref || m.Attempt != 1 || m.Time.IsZero() {
				t.Fatalf("message %+v: want Source sqs, Ref = ID = MessageId, Attempt 1, a time", m)
			}
		}
		settle(t, src, b, b.Messages, nil)
	}
	expectEmpty(t, c, queue)
	if st := src.Stats(); st.Deleted != n || st.DeleteErrors != 0 {
		t.Fatalf("stats %+v, want %d deleted", st, n)
	}
}

// TestLaneNotFetchedTwice: while a lane's batch is in flight, Fetch hands out
// nothing else of it, even with more of its messages held.
func TestLaneNotFetchedTwice(t *testing.T) {
	t.Parallel()
	c := client(t)
	queue := fauxqs.NewQueue(t, c, "lane", nil)
	src := newSource(t, c, queue, quick(sqs.Config{Receivers: 1}))
	send(t, c, queue, numbered("m", 30, nil))

	first := fetch(t, src, 5)
	// Let the receiver buffer the rest.
	deadline := time.Now().Add(10 * time.Second)
	for src.Stats().Received < 30 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	b, err := src.Fetch(ctx, 5)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Fetch of the only lane while its batch is in flight: got %v, %v; want to wait", b, err)
	}
	settle(t, src, first, first.Messages, nil)
	got := len(first.Messages)
	for got < 30 {
		b := fetch(t, src, 100)
		got += len(b.Messages)
		settle(t, src, b, b.Messages, nil)
	}
	expectEmpty(t, c, queue)
}

// TestAbandonedReappears: a message in neither list of Settle (a crash)
// comes back after its visibility timeout, with the next attempt number.
func TestAbandonedReappears(t *testing.T) {
	t.Parallel()
	c := client(t)
	queue := fauxqs.NewQueue(t, c, "abandon", nil)
	src := newSource(t, c, queue, quick(sqs.Config{Receivers: 1}))
	send(t, c, queue, numbered("m", 1, nil))

	b := fetch(t, src, 10)
	ref := b.Messages[0].Ref
	settle(t, src, b, nil, nil)
	b = fetch(t, src, 10)
	if m := b.Messages[0]; m.Ref != ref || m.Attempt != 2 {
		t.Fatalf("redelivered %s attempt %d, want %s attempt 2", m.Ref, m.Attempt, ref)
	}
	settle(t, src, b, b.Messages, nil)
	expectEmpty(t, c, queue)
	if st := src.Stats(); st.Abandoned != 1 {
		t.Fatalf("stats %+v, want 1 abandoned", st)
	}
}

// TestRetryHandsBack: a retried message is delivered again after its delay
// with the next attempt; the other messages of the batch are deleted.
func TestRetryHandsBack(t *testing.T) {
	t.Parallel()
	c := client(t)
	queue := fauxqs.NewQueue(t, c, "retry", nil)
	src := newSource(t, c, queue, quick(sqs.Config{Receivers: 1, VisibilityTimeout: 30 * time.Second, HeartbeatInterval: 10 * time.Second}))
	send(t, c, queue, numbered("m", 3, nil))

	var all []*consumer.Message
	for len(all) < 3 {
		b := fetch(t, src, 10)
		all = append(all, b.Messages...)
		var ack []*consumer.Message
		var retry []consumer.Retry
		for _, m := range b.Messages {
			if string(m.Value) == "m-1" {
				retry = append(retry, consumer.Retry{Message: m, Delay: time.Second})
			} else {
				ack = append(ack, m)
			}
		}
		settle(t, src, b, ack, retry)
	}
	// The visibility timeout is 30s: only the retry delay brings it back soon.
	b := fetch(t, src, 10)
	if m := b.Messages[0]; string(m.Value) != "m-1" || m.Attempt != 2 {
		t.Fatalf("got %s attempt %d, want m-1 attempt 2", m.Value, m.Attempt)
	}
	settle(t, src, b, b.Messages, nil)
	expectEmpty(t, c, queue)
}

// TestHeartbeat holds a batch for several visibility timeouts: the heartbeat
// keeps its message from any other receiver, and Settle then deletes it.
func TestHeartbeat(t *testing.T) {
	t.Parallel()
	c := client(t)
	queue := fauxqs.NewQueue(t, c, "heartbeat", nil)
	src := newSource(t, c, queue, sqs.Config{Receivers: 1, WaitTime: time.Second, VisibilityTimeout: 2 * time.Second, HeartbeatInterval: time.Second})
	send(t, c, queue, numbered("slow", 1, nil))

	b := fetch(t, src, 10)
	// Another worker polls for three visibility timeouts while the batch is
	// in flight.
	stop := time.Now().Add(6 * time.Second)
	for time.Now().Before(stop) {
		if got := receiveRaw(t, c, queue, time.Second); len(got) > 0 {
			t.Fatalf("another receiver got %s while the batch was in flight: the heartbeat did not keep it invisible", aws.ToString(got[0].Body))
		}
	}
	if st := src.Stats(); st.Renewed < 3 || st.HeartbeatErrors != 0 {
		t.Fatalf("stats %+v, want at least 3 renewals and no errors", st)
	}
	settle(t, src, b, b.Messages, nil)
	expectEmpty(t, c, queue)
}

// TestBufferedMessagesKeptInvisible: messages a receiver holds before they
// are fetched are renewed too.
func TestBufferedMessagesKeptInvisible(t *testing.T) {
	t.Parallel()
	c := client(t)
	queue := fauxqs.NewQueue(t, c, "buffered", nil)
	src := newSource(t, c, queue, sqs.Config{Receivers: 1, WaitTime: time.Second, VisibilityTimeout: 2 * time.Second, HeartbeatInterval: time.Second})
	send(t, c, queue, numbered("m", 20, nil))
	b := fetch(t, src, 1)
	time.Sleep(5 * time.Second)
	if v, _ := queueDepth(t, c, queue); v != 0 {
		t.Fatalf("%d messages visible again while held", v)
	}
	got := len(b.Messages)
	settle(t, src, b, b.Messages, nil)
	for got < 20 {
		b := fetch(t, src, 100)
		for _, m := range b.Messages {
			if m.Attempt != 1 {
				t.Fatalf("%s has attempt %d: it was redelivered while held", m.Value, m.Attempt)
			}
		}
		got += len(b.Messages)
		settle(t, src, b, b.Messages, nil)
	}
	expectEmpty(t, c, queue)
}

// TestCloseReleasesUnfetched: Close makes held but unfetched messages
// visible at once, and a batch in flight can still be settled after it.
func TestCloseReleasesUnfetched(t *testing.T) {
	t.Parallel()
	c := client(t)
	queue := fauxqs.NewQueue(t, c, "close", nil)
	cfg := sqs.Config{Client: c, QueueURL: queue, Receivers: 1, WaitTime: time.Second, VisibilityTimeout: 60 * time.Second}
	src, err := sqs.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	send(t, c, queue, numbered("m", 5, nil))
	b := fetch(t, src, 1)
	deadline := time.Now().Add(10 * time.Second)
	for src.Stats().Received < 5 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := src.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := src.Fetch(context.Background(), 10); !errors.Is(err, sqs.ErrClosed) {
		t.Fatalf("Fetch after Close: %v, want ErrClosed", err)
	}
	settle(t, src, b, b.Messages, nil)
	var got []string
	for len(got) < 4 {
		msgs := receiveRaw(t, c, queue, time.Second)
		if len(msgs) == 0 {
			t.Fatalf("released messages are not visible: got %v; stats %+v; depth %v", got, src.Stats(), fmt.Sprint(queueDepth(t, c, queue)))
		}
		for _, m := range msgs {
			got = append(got, aws.ToString(m.Body))
		}
	}
	if slices.Contains(got, string(b.Messages[0].Value)) {
		t.Fatalf("the settled message %s came back", b.Messages[0].Value)
	}
}

// TestDeleteFailureReported: acknowledged messages that cannot be deleted
// make Settle return a *DeleteError naming them.
func TestDeleteFailureReported(t *testing.T) {
	t.Parallel()
	c := client(t)
	queue := fauxqs.NewQueue(t, c, "delfail", nil)
	src := newSource(t, c, queue, quick(sqs.Config{Receivers: 1}))
	send(t, c, queue, numbered("m", 3, nil))
	var msgs []*consumer.Message
	var batches []*consumer.Batch
	for len(msgs) < 3 {
		b := fetch(t, src, 10)
		batches = append(batches, b)
		msgs = append(msgs, b.Messages...)
	}
	if _, err := c.DeleteQueue(context.Background(), &awssqs.DeleteQueueInput{QueueUrl: aws.String(queue)}); err != nil {
		t.Fatal(err)
	}
	var failed int
	for _, b := range batches {
		err := src.Settle(context.Background(), b, b.Messages, nil)
		var de *sqs.DeleteError
		if !errors.As(err, &de) || len(de.Failed) != len(b.Messages) {
			t.Fatalf("Settle on a deleted queue: got %v, want a DeleteError for %d messages", err, len(b.Messages))
		}
		failed += len(de.Failed)
		if de.Failed[0].MessageID != b.Messages[0].Ref {
			t.Fatalf("DeleteError names %s, want %s", de.Failed[0].MessageID, b.Messages[0].Ref)
		}
	}
	if st := src.Stats(); st.DeleteErrors != int64(failed) {
		t.Fatalf("stats %+v, want %d delete errors", st, failed)
	}
}

// TestHorizonAndRedrive reads retention and the redrive policy at New.
func TestHorizonAndRedrive(t *testing.T) {
	t.Parallel()
	c := client(t)
	dlq := fauxqs.NewQueue(t, c, "dlq", nil)
	arn := queueARN(t, c, dlq)
	queue := fauxqs.NewQueue(t, c, "horizon", map[string]string{
		"MessageRetentionPeriod": "3600",
		"RedrivePolicy":          `{"deadLetterTargetArn":"` + arn + `","maxReceiveCount":"3"}`,
	})
	var logs strings.Builder
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil))
	src := newSource(t, c, queue, quick(sqs.Config{UseQueueRedrive: true, Logger: logger}))
	logMu.Lock()
	if !strings.Contains(logs.String(), "exhausted messages are left to the queue's redrive policy") || !strings.Contains(logs.String(), "max_receive_count=3") {
		t.Errorf("start-up log does not say that the redrive policy applies:\n%s", logs.String())
	}
	logMu.Unlock()
	if h, err := src.RedeliveryHorizon(context.Background()); err != nil || h != time.Hour {
		t.Fatalf("RedeliveryHorizon = %s, %v; want 1h", h, err)
	}
	if n := src.MaxReceiveCount(); n != 3 {
		t.Fatalf("MaxReceiveCount = %d, want 3", n)
	}
	logs.Reset()
	newSource(t, c, queue, quick(sqs.Config{Logger: logger}))
	logMu.Lock()
	if !strings.Contains(logs.String(), "exhausted messages are parked in Postgres by the consumer and deleted, but the queue also has a redrive policy") {
		t.Errorf("start-up log does not warn about the redrive policy:\n%s", logs.String())
	}
	logMu.Unlock()
	plain := fauxqs.NewQueue(t, c, "noredrive", nil)
	_, err := sqs.New(context.Background(), quick(sqs.Config{Client: c, QueueURL: plain, UseQueueRedrive: true}))
	var ce *sqs.ConfigError
	if !errors.As(err, &ce) || ce.Field != "UseQueueRedrive" {
		t.Fatalf("UseQueueRedrive on a queue without a redrive policy: got %v", err)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func queueARN(tb testing.TB, c *awssqs.Client, queue string) string {
	tb.Helper()
	out, err := c.GetQueueAttributes(context.Background(), &awssqs.GetQueueAttributesInput{
		QueueUrl: aws.String(queue), AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameQueueArn},
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out.Attributes["QueueArn"]
}

// TestConcurrentFetchers: several goroutines fetching and settling at once
// see every message once, and never two batches of one lane at a time.
func TestConcurrentFetchers(t *testing.T) {
	t.Parallel()
	c := client(t)
	queue := fauxqs.NewQueue(t, c, "concurrent", nil)
	src := newSource(t, c, queue, quick(sqs.Config{Receivers: 3}))
	const n = 600
	send(t, c, queue, numbered("m", n, nil))

	var mu sync.Mutex
	seen := map[string]int{}
	busy := map[string]bool{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				b, err := src.Fetch(ctx, 50)
				if err != nil {
					return
				}
				mu.Lock()
				if busy[b.Lane] {
					errc <- errors.New("two batches of lane " + b.Lane + " in flight")
				}
				busy[b.Lane] = true
				for _, m := range b.Messages {
					seen[string(m.Value)]++
				}
				done := len(seen) == n
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				busy[b.Lane] = false
				mu.Unlock()
				if err := src.Settle(ctx, b, b.Messages, nil); err != nil {
					errc <- err
				}
				if done {
					cancel()
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for k, v := range seen {
		if v != 1 {
			t.Fatalf("%s delivered %d times", k, v)
		}
	}
	if len(seen) != n {
		t.Fatalf("saw %d messages, want %d", len(seen), n)
	}
	expectEmpty(t, c, queue)
}
