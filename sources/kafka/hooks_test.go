package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// hookLog records, in order, what the rebalance hooks and the workers of
// TestRebalanceHooks saw.
type hookLog struct {
	mu     sync.Mutex
	events []hookEvent
}

type hookEvent struct {
	member, kind, lane string
}

func (h *hookLog) add(member, kind, lane string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, hookEvent{member, kind, lane})
}

func (h *hookLog) hooks(member string) func(*Config) {
	return func(c *Config) {
		c.OnAssigned = func(_ context.Context, tps []TopicPartition) {
			for _, tp := range tps {
				h.add(member, "assigned", tp.String())
			}
		}
		c.OnRevoked = func(_ context.Context, tps []TopicPartition) {
			for _, tp := range tps {
				h.add(member, "revoked", tp.String())
			}
		}
	}
}

func (h *hookLog) snapshot() []hookEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]hookEvent(nil), h.events...)
}

// TestRebalanceHooks: OnAssigned comes after the claim and before the
// first batch of a partition; OnRevoked after the partition's in-flight
// batch committed, and before another member is assigned the partition.
func TestRebalanceHooks(t *testing.T) {
	e := newEnv(t, 4)
	e.produce(0, 400)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log hookLog
	a := e.source(log.hooks("A"))

	// A's worker: once B has started, it holds the next batch it fetches
	// until its generation ends, then commits it.
	var hold atomic.Bool
	held := make(chan string, 1)
	var aDone sync.WaitGroup
	aDone.Add(1)
	go func() {
		defer aDone.Done()
		for {
			b, err := a.Fetch(ctx, 10)
			if err != nil {
				return
			}
			l := b.SourceData.(*lane)
			if hold.CompareAndSwap(true, false) {
				log.add("A", "fetched-held", b.Lane)
				for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
					a.mu.Lock()
					revoking := l.state == laneRevoking
					a.mu.Unlock()
					if revoking {
						break
					}
					if time.Now().After(deadline) {
						t.Errorf("A's generation did not end within a minute of B's start")
						break
					}
				}
				// Recorded between the commit and Settle: Settle is what
				// lets the revocation go on, so an event logged after it
				// could come after OnRevoked's.
				afterCommit := func() { log.add("A", "committed-held", b.Lane) }
				if err := processThen(ctx, a, e.pool, b, afterCommit); err != nil {
					t.Errorf("the batch held over the end of the generation: %v", err)
				}
				held <- b.Lane
				continue
			}
			log.add("A", "fetched", b.Lane)
			if err := process(ctx, a, e.pool, b, nil); err != nil && ctx.Err() == nil {
				log.add("A", "failed", b.Lane)
				continue
			}
			log.add("A", "committed", b.Lane)
		}
	}()
	waitFor(t, time.Minute, "A's first batches", func() bool { _, d := e.effects(); return d >= 40 })

	// A may have consumed all 400 by now: the records produced next give
	// it the batch it holds.
	hold.Store(true)
	b := e.source(log.hooks("B"))
	wb := startWorkers(ctx, b, e.pool, 1, 10, nil)
	e.produce(400, 800)
	var heldLane string
	select {
	case heldLane = <-held:
	case <-ctx.Done():
		t.Fatal("A's held batch was never fetched")
	}
	waitFor(t, time.Minute, "two partitions for each member", func() bool {
		return len(a.Assignment()) == 2 && len(b.Assignment()) == 2
	})
	e.waitEffects(800, 2*time.Minute)
	cancel()
	aDone.Wait()
	wb.wait(t)

	events := log.snapshot()
	var trace strings.Builder
	for _, ev := range events {
		fmt.Fprintf(&trace, "%s %s %s\n", ev.member, ev.kind, ev.lane)
	}
	owner := map[string]string{} // lane → member between assigned and revoked
	heldFetched, heldCommitted, heldRevoked := -1, -1, -1
	for i, ev := range events {
		switch ev.kind {
		case "assigned":
			if o := owner[ev.lane]; o != "" {
				t.Fatalf("event %d: %s assigned %s while %s still owns it\n%s", i, ev.member, ev.lane, o, trace.String())
			}
			owner[ev.lane] = ev.member
		case "revoked":
			if owner[ev.lane] != ev.member {
				t.Fatalf("event %d: %s revoked %s, owned by %q\n%s", i, ev.member, ev.lane, owner[ev.lane], trace.String())
			}
			delete(owner, ev.lane)
			if ev.member == "A" && ev.lane == heldLane && heldFetched >= 0 && heldRevoked < 0 {
				heldRevoked = i
			}
		case "fetched-held":
			heldFetched = i
			fallthrough
		case "fetched":
			if owner[ev.lane] != ev.member {
				t.Fatalf("event %d: %s fetched a batch of %s before OnAssigned (owner %q)\n%s", i, ev.member, ev.lane, owner[ev.lane], trace.String())
			}
		case "committed-held":
			heldCommitted = i
		}
	}
	if heldCommitted < 0 || heldRevoked < heldCommitted {
		t.Fatalf("A's OnRevoked for %s (event %d) came before its in-flight batch committed (event %d)\n%s",
			heldLane, heldRevoked, heldCommitted, trace.String())
	}
	if rows, distinct := e.effects(); rows != 800 || distinct != 800 {
		t.Fatalf("%d effect rows for %d distinct messages, want 800 of each", rows, distinct)
	}
}

// The defaults a worker service gets, and the checks of the fields that go
// with them.
func TestGroupConfigDefaults(t *testing.T) {
	d := Config{Brokers: []string{"b:1"}, Group: "g", Topics: []string{"t"}}.withDefaults()
	if d.SessionTimeout != 10*time.Second || d.HeartbeatInterval != time.Second || d.RebalanceTimeout != 30*time.Second ||
		d.RevokeTimeout != 10*time.Second || d.MetadataInterval != 10*time.Second {
		t.Errorf("defaults: session %s, heartbeat %s, rebalance %s, revoke %s, metadata %s",
			d.SessionTimeout, d.HeartbeatInterval, d.RebalanceTimeout, d.RevokeTimeout, d.MetadataInterval)
	}
	if h := (Config{SessionTimeout: 6 * time.Second}).withDefaults().HeartbeatInterval; h != time.Second {
		t.Errorf("heartbeat for a 6s session: %s, want 1s", h)
	}
	for field, mutate := range map[string]func(*Config){
		"MetadataInterval": func(c *Config) { c.MetadataInterval = -time.Second },
	} {
		c := Config{Brokers: []string{"b:1"}, Group: "g", Topics: []string{"t"}, KafkaOffsetsOnly: true}
		mutate(&c)
		_, err := New(nil, c)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("%s: got %v, want a ConfigError for it", field, err)
		}
	}
}
