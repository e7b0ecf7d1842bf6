package sqs_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/sources/sqs"
)

func fifoMessages(group string, n int) []outgoing {
	return numbered(group, n, func(i int, m *outgoing) {
		m.Group = group
		m.DedupeID = fmt.Sprintf("%s-dedupe-%d", group, i)
	})
}

// TestFIFOLanesAndOrder: every message group is a lane, two groups are in
// flight at once, a group never has two batches in flight, and a retried
// message comes back before the rest of its group.
func TestFIFOLanesAndOrder(t *testing.T) {
	t.Parallel()
	c := client(t)
	queue := fauxqs.NewQueue(t, c, "order.fifo", nil)
	src := newSource(t, c, queue, quick(sqs.Config{Receivers: 2}))
	if !src.FIFO() {
		t.Fatal("FIFO() = false for a .fifo queue")
	}
	const n = 6
	send(t, c, queue, append(fifoMessages("a", n), fifoMessages("b", n)...))

	// Two batches in flight at once, of different groups.
	b1 := fetch(t, src, 10)
	b2 := fetch(t, src, 10)
	if b1.Lane == b2.Lane {
		t.Fatalf("two batches of lane %s in flight at once", b1.Lane)
	}
	for _, b := range []*consumer.Batch{b1, b2} {
		if b.Lane != "group/a" && b.Lane != "group/b" {
			t.Fatalf("lane %q, want group/a or group/b", b.Lane)
		}
		for _, m := range b.Messages {
			group := strings.TrimPrefix(b.Lane, "group/")
			if string(m.Key) != group || !strings.HasPrefix(m.ID, group+"-dedupe-") {
				t.Fatalf("message %s: Key %q ID %q, want the group and its MessageDeduplicationId", m.Value, m.Key, m.ID)
			}
			info, _ := sqs.MessageInfo(m)
			if info.GroupID != group || info.SequenceNumber == "" {
				t.Fatalf("MessageInfo %+v", info)
			}
		}
	}
	// A third Fetch has nothing: both groups are in flight.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	if b, err := src.Fetch(ctx, 10); err == nil {
		t.Fatalf("third Fetch returned lane %s while both groups are in flight", b.Lane)
	}
	cancel()

	// Group a: its first batch is handed back whole (as a consumer that keeps
	// order does when the head fails); group b is acknowledged.
	applied := map[string][]string{}
	attempts := map[string]int{}
	pending := []*consumer.Batch{b1, b2}
	retriedA := false
	for len(applied["a"]) < n || len(applied["b"]) < n {
		var b *consumer.Batch
		if len(pending) > 0 {
			b, pending = pending[0], pending[1:]
		} else {
			b = fetch(t, src, 10)
		}
		group := strings.TrimPrefix(b.Lane, "group/")
		for _, m := range b.Messages {
			attempts[string(m.Value)] = m.Attempt
		}
		if group == "a" && !retriedA {
			retriedA = true
			var retry []consumer.Retry
			for _, m := range b.Messages {
				retry = append(retry, consumer.Retry{Message: m, Delay: time.Second})
			}
			settle(t, src, b, nil, retry)
			continue
		}
		applied[group] = append(applied[group], bodies(b.Messages)...)
		settle(t, src, b, b.Messages, nil)
	}
	for _, g := range []string{"a", "b"} {
		want := bodies(messagesOf(fifoMessages(g, n)))
		if !slices.Equal(applied[g], want) {
			t.Fatalf("group %s applied in order %v, want %v", g, applied[g], want)
		}
	}
	if attempts["a-0"] != 2 {
		t.Fatalf("a-0 was retried, its last attempt is %d, want 2", attempts["a-0"])
	}
	expectEmpty(t, c, queue)
}

func messagesOf(out []outgoing) []*consumer.Message {
	ms := make([]*consumer.Message, len(out))
	for i, o := range out {
		ms[i] = &consumer.Message{Value: []byte(o.Body)}
	}
	return ms
}
