package consumertest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
)

func fetch(t *testing.T, b *consumertest.Broker, max int) *consumer.Batch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	batch, err := b.Fetch(ctx, max)
	if err != nil {
		t.Fatal(err)
	}
	return batch
}

func ids(b *consumer.Batch) []string {
	var out []string
	for _, m := range b.Messages {
		out = append(out, m.ID)
	}
	return out
}

func TestLaneOrderAndOneBatchPerLane(t *testing.T) {
	b := consumertest.New(consumertest.Config{Lanes: 2})
	for i := range 6 {
		b.Publish(i%2, consumer.Message{ID: fmt.Sprint(i)})
	}
	first := fetch(t, b, 10)
	second := fetch(t, b, 10)
	if first.Lane == second.Lane {
		t.Fatalf("two batches of lane %s in flight", first.Lane)
	}
	if got := fmt.Sprint(ids(first)); got != "[0 2 4]" && got != "[1 3 5]" {
		t.Fatalf("lane order broken: %s", got)
	}
	// Both lanes are busy: Fetch blocks until one is settled.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := b.Fetch(ctx, 10); err == nil {
		t.Fatal("Fetch returned while every lane had a batch in flight")
	}
	if err := b.Settle(context.Background(), first, first.Messages, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.Settle(context.Background(), second, second.Messages, nil); err != nil {
		t.Fatal(err)
	}
	if !b.Idle() || b.Unacked() != 0 {
		t.Fatal("broker not idle after every message was acknowledged")
	}
}

func TestCrashRedeliversUnacknowledgedInOrder(t *testing.T) {
	b := consumertest.New(consumertest.Config{Lanes: 1})
	for i := range 5 {
		b.Publish(0, consumer.Message{ID: fmt.Sprint(i)})
	}
	batch := fetch(t, b, 2)
	if err := b.Settle(context.Background(), batch, batch.Messages[:1], nil); err != nil { // ack 0; 1 abandoned
		t.Fatal(err)
	}
	stale := fetch(t, b, 2) // 1 again, then 2
	if got := fmt.Sprint(ids(stale)); got != "[1 2]" {
		t.Fatalf("after abandoning 1: %s", got)
	}
	b.Crash()
	if err := b.Settle(context.Background(), stale, stale.Messages, nil); err != nil {
		t.Fatal(err)
	}
	again := fetch(t, b, 10)
	if got := fmt.Sprint(ids(again)); got != "[1 2 3 4]" {
		t.Fatalf("after the crash: %s, want the unacknowledged 1 2 3 4", got)
	}
	if again.Messages[0].Attempt != 3 {
		t.Errorf("attempt %d, want 3", again.Messages[0].Attempt)
	}
}

func TestRetryWaitsForItsDelay(t *testing.T) {
	b := consumertest.New(consumertest.Config{Lanes: 1})
	b.Publish(0, consumer.Message{ID: "a"})
	batch := fetch(t, b, 1)
	start := time.Now()
	if err := b.Settle(context.Background(), batch, nil, []consumer.Retry{{Message: batch.Messages[0], Delay: 30 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	again := fetch(t, b, 1)
	if time.Since(start) < 30*time.Millisecond {
		t.Fatal("retry delivered before its delay")
	}
	if again.Messages[0].ID != "a" || again.Messages[0].Attempt != 2 {
		t.Fatalf("redelivered %+v", again.Messages[0])
	}
}

func TestDuplicatesAreDeliveredEvenAfterAck(t *testing.T) {
	b := consumertest.New(consumertest.Config{Lanes: 1, DuplicateRate: 1})
	b.Publish(0, consumer.Message{ID: "a"})
	first := fetch(t, b, 1)
	if err := b.Settle(context.Background(), first, first.Messages, nil); err != nil {
		t.Fatal(err)
	}
	dup := fetch(t, b, 1)
	if dup.Messages[0].ID != "a" || b.Stats().Duplicated == 0 || b.Redelivered() != 1 {
		t.Fatalf("no duplicate delivery: %v, %+v", ids(dup), b.Stats())
	}
}
