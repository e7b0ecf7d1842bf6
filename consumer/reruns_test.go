package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/jackc/pgx/v5"
)

// TestHealthyMessagesRunAtMostTwice checks the bound the Handler docs give:
// however many batch-mates fail, a healthy message's handler runs at most
// twice for one delivery, and BatchStats.Reruns counts the extra runs.
func TestHealthyMessagesRunAtMostTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	const n = 12
	poison := map[string]bool{"m-2": true, "m-6": true, "m-9": true}
	var mu sync.Mutex
	calls := map[string]int{}
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		mu.Lock()
		calls[m.ID]++
		mu.Unlock()
		if poison[m.ID] {
			return consumer.Permanent(errors.New("poison"))
		}
		return insertEffect(ctx, tx, m)
	}
	for i := range n {
		id := fmt.Sprintf("m-%d", i)
		e.broker.Publish(0, msg(id, id))
	}
	e.runUntilIdle(e.consumer(consumer.Config{Handler: h, BatchSize: n}), 30*time.Second)

	if got := len(e.parked()); got != len(poison) {
		t.Fatalf("parked %d, want %d", got, len(poison))
	}
	effects := e.effectCounts()
	extra := 0
	for i := range n {
		id := fmt.Sprintf("m-%d", i)
		if c := calls[id]; c < 1 || c > 2 {
			t.Errorf("%s: handler ran %d times for one delivery, want 1 or 2", id, c)
		}
		extra += calls[id] - 1
		if want := map[bool]int{true: 0, false: 1}[poison[id]]; effects[id] != want {
			t.Errorf("%s: %d effects, want %d", id, effects[id], want)
		}
	}
	batches := e.hooks.Batches()
	reruns := 0
	for _, b := range batches {
		reruns += b.Reruns
		if b.Size != n {
			t.Fatalf("batch of %d messages, want all %d in one", b.Size, n)
		}
	}
	if reruns != extra || extra == 0 {
		t.Errorf("BatchStats.Reruns %d, handler ran %d extra times", reruns, extra)
	}
}
