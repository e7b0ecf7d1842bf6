package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// recHook records every relay event.
type recHook struct {
	mu      sync.Mutex
	passes  []PassStats
	wakes   map[WakeKind]int
	leases  []LeaseEvent
	backlog [][]Backlog
}

var (
	_ RelayHook   = (*recHook)(nil)
	_ WakeHook    = (*recHook)(nil)
	_ LeaseHook   = (*recHook)(nil)
	_ BacklogHook = (*recHook)(nil)
)

func (h *recHook) PassDone(_ context.Context, s *PassStats) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.passes = append(h.passes, *s)
}

func (h *recHook) Woke(_ context.Context, _ string, k WakeKind) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.wakes == nil {
		h.wakes = map[WakeKind]int{}
	}
	h.wakes[k]++
}

func (h *recHook) LeasesChanged(_ context.Context, e LeaseEvent) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.leases = append(h.leases, e)
}

func (h *recHook) Backlog(_ context.Context, _ string, b []Backlog) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.backlog = append(h.backlog, b)
}

// totals sums the passes' counts.
func (h *recHook) totals() (published, retried, parked, latencies int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.passes {
		for _, p := range s.Sinks {
			published += p.Published
			retried += p.Retried
			parked += p.Parked
			latencies += len(p.CommitToPublish)
		}
	}
	return
}

// TestHooksCountWhatWasPublished: the pass events add up to what the sink
// got, the refused message is counted parked, the flaky one retried and
// then published, and the lease and wake-up events arrive.
func TestHooksCountWhatWasPublished(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	sink := newMemSink()
	sink.refuse["bad"] = Permanent(errors.New("too large"))
	sink.failTimes["flaky"] = 1
	h := &recHook{}
	listening := make(chan struct{})
	var once sync.Once
	_, run := startRelay(t, db, RelayConfig{Owner: "r1", Sinks: map[string]Sink{"s": sink}, Hooks: []RelayHook{h},
		PollInterval: 10 * time.Minute, LeaseTTL: 30 * time.Minute,
		onListen: func() { once.Do(func() { close(listening) }) }})
	<-listening
	const n = 20
	var want []string
	msgs := []Message{msg("kb", "bad"), msg("kf", "flaky")}
	for i := range n {
		id := fmt.Sprintf("m%d", i)
		msgs = append(msgs, msg(fmt.Sprintf("k%d", i%5), id))
		want = append(want, id)
	}
	emit(t, db, o, msgs...)
	sink.waitFor(t, 2*time.Minute, "the first messages", hasIDs(want...))
	// Polls are ten minutes apart: each emit's NOTIFY wakes the relay,
	// until a wake-up finds the flaky message's backoff over.
	for i := 0; !hasIDs("flaky")(sink.messages()); i++ {
		if i == 100 {
			t.Fatal("the flaky message was never retried")
		}
		id := fmt.Sprintf("nudge%d", i)
		emit(t, db, o, msg("kn", id))
		want = append(want, id)
		sink.waitFor(t, 2*time.Minute, id, hasIDs(id))
	}
	waitUntil(t, 2*time.Minute, "the pass events", func() bool {
		p, _, parked, _ := h.totals()
		return p == len(want)+1 && parked == 1
	})
	published, retried, parked, lat := h.totals()
	if published != len(sink.messages()) || parked != 1 || retried != 1 || lat != published {
		t.Errorf("published %d (sink got %d), retried %d (want 1), parked %d (want 1), latencies %d",
			published, len(sink.messages()), retried, parked, lat)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.passes {
		if s.Owner != "r1" || s.Read == 0 || s.Err != nil || len(s.Sinks) != 1 || s.Sinks[0].Sink != "s" {
			t.Errorf("pass %+v", s)
		}
		for _, d := range s.Sinks[0].CommitToPublish {
			if d <= 0 || d > time.Minute {
				t.Errorf("commit-to-publish latency %v", d)
			}
		}
	}
	if h.wakes[WakeNotify] == 0 {
		t.Errorf("no NOTIFY wake-up: %v", h.wakes)
	}
	acquired, released := 0, 0
	for _, e := range h.leases {
		if e.Owner != "r1" {
			t.Errorf("lease event %+v", e)
		}
		acquired += e.Acquired
		released += e.Released
	}
	if acquired != Partitions || released != Partitions {
		t.Errorf("leases acquired %d, released %d; want %d each (%+v)", acquired, released, Partitions, h.leases)
	}
	if last := h.leases[len(h.leases)-1]; last.Held != 0 {
		t.Errorf("after shutdown, held %d", last.Held)
	}
}

// TestHooksPollWake: a poll-only relay's wake-ups are polls.
func TestHooksPollWake(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	sink := newMemSink()
	h := &recHook{}
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, Hooks: []RelayHook{h}, PollOnly: true, PollInterval: 20 * time.Millisecond})
	emit(t, db, o, msg("k", "m1"))
	sink.waitFor(t, 2*time.Minute, "m1", hasIDs("m1"))
	waitUntil(t, 2*time.Minute, "poll wake-ups", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.wakes[WakePoll] > 0
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.wakes[WakeNotify] != 0 {
		t.Errorf("a poll-only relay woke on NOTIFY: %v", h.wakes)
	}
}

// TestHooksBacklog: rows on a retry path wait, and the backlog report says
// how many and how old; parked rows are not waiting.
func TestHooksBacklog(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	sink := newMemSink()
	for _, id := range []string{"a", "b", "c"} {
		sink.failTimes[id] = 1 << 30
	}
	sink.refuse["p"] = Permanent(errors.New("no such queue"))
	emit(t, db, o, msg("k1", "a"), msg("k2", "b"), msg("k3", "c"), msg("k4", "p"),
		Message{Sink: "t", Key: []byte("x"), ID: "t1"}) // no sink "t": parked
	h := &recHook{}
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, Hooks: []RelayHook{h},
		MinBackoff: time.Hour, MaxBackoff: time.Hour, BacklogInterval: 10 * time.Millisecond})
	waitUntil(t, 2*time.Minute, "a backlog of the three retried rows", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		parked := 0
		for _, s := range h.passes {
			for _, p := range s.Sinks {
				parked += p.Parked
			}
		}
		if parked < 2 || len(h.backlog) == 0 {
			return false
		}
		b := h.backlog[len(h.backlog)-1]
		return len(b) == 1 && b[0].Sink == "s" && b[0].Waiting == 3
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.backlog[len(h.backlog)-1][0]
	if b.Oldest <= 0 || b.Oldest > time.Minute {
		t.Errorf("oldest %v", b.Oldest)
	}
}
