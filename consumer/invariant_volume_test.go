package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/jackc/pgx/v5"
)

// TestInvariantVolume is the promise at volume, with idset: N logical
// messages, delivered over several lanes with duplicates, crashes after
// commit and before ack, crashes in the middle of handlers, restarts and
// poison messages, leave exactly one effect for each good message and
// exactly one parked row for each poison one. TestInvariant covers every
// strategy and many more failure modes, at small N over many seeds.
func TestInvariantVolume(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		n    int
		size int
	}{
		{"BatchHandler", 100_000, 500},
		{"QueueHandler", 100_000, 500},
		{"Handler", 20_000, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if testing.Short() {
				tc.n /= 10
			}
			runInvariant(t, tc.n, tc.name, tc.size)
		})
	}
}

var errCrash = errors.New("consumer crashed mid-handler")

func runInvariant(t *testing.T, n int, shape string, size int) {
	e := newEnv(t, consumertest.Config{Lanes: 4, DuplicateRate: 0.3, LostAckRate: 0.1, Seed: uint64(n)})
	poison := func(id int) bool { return id%997 == 0 }
	nPoison := 0
	for i := range n {
		if poison(i) {
			nPoison++
		}
		e.broker.Publish(i%4, consumer.Message{ID: fmt.Sprint(i), Value: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}

	// A crash mid-handler: the broker forgets every unacknowledged delivery
	// and the handler fails, so its batch commits without it (or not at
	// all) and nothing of the batch is acknowledged. A crash counts as a
	// failed attempt of that message, so crashes are rare enough that no
	// good message runs out of its MaxAttempts on them.
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(7, uint64(n)))
	crashNow := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return rng.Float64() < 0.0003
	}
	check := func(m *consumer.Message) error {
		var id int
		fmt.Sscan(m.ID, &id)
		if poison(id) {
			return fmt.Errorf("poison message %d", id)
		}
		if crashNow() {
			e.broker.Crash()
			return errCrash
		}
		return nil
	}
	cfg := consumer.Config{BatchSize: size, MaxAttempts: 8}
	switch shape {
	case "QueueHandler":
		cfg.QueueHandler = func(ctx context.Context, q consumer.Queue, m *consumer.Message) error {
			if err := check(m); err != nil {
				return err
			}
			return queueEffect(ctx, q, m)
		}
	case "BatchHandler":
		cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
			for _, m := range msgs {
				if err := check(m); err != nil {
					return err
				}
			}
			return insertEffects(ctx, tx, msgs)
		}
	default:
		cfg.Handler = func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if err := check(m); err != nil {
				return err
			}
			return insertEffect(ctx, tx, m)
		}
	}

	// Run the consumer in several lifetimes, each stopped after a while,
	// until everything was delivered and acknowledged.
	deadline := time.Now().Add(3 * time.Minute)
	for lifetime := 0; !e.broker.Idle(); lifetime++ {
		if time.Now().After(deadline) {
			t.Fatalf("not done after %d lifetimes: %d unacknowledged", lifetime, e.broker.Unacked())
		}
		c := e.consumer(cfg)
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(300+lifetime*200)*time.Millisecond)
		go func() {
			for ctx.Err() == nil && !e.broker.Idle() {
				time.Sleep(5 * time.Millisecond)
			}
			cancel()
		}()
		if err := c.Run(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
	}

	st := e.broker.Stats()
	redelivered := e.broker.Redelivered()
	t.Logf("%d messages: %d deliveries, %d delivered twice or more, %d lost acks, %d crashes",
		n, st.Delivered, redelivered, st.LostAcks, st.Crashes)
	if redelivered < n/5 {
		t.Errorf("only %d of %d messages were delivered twice or more, want at least 20%%", redelivered, n)
	}
	if st.LostAcks == 0 || st.Crashes == 0 {
		t.Errorf("the run had %d lost acks and %d crashes; want some of each", st.LostAcks, st.Crashes)
	}

	counts := e.effectCounts()
	for i := range n {
		id := fmt.Sprint(i)
		switch k := counts[id]; {
		case poison(i) && k != 0:
			t.Errorf("poison message %s has %d effects", id, k)
		case !poison(i) && k != 1:
			t.Errorf("message %s has %d effects, want 1", id, k)
		}
	}
	if len(counts) != n-nPoison {
		t.Errorf("%d messages have effects, want %d", len(counts), n-nPoison)
	}
	parked := e.parked()
	seen := map[string]bool{}
	for _, p := range parked {
		var id int
		fmt.Sscan(*p.DedupeID, &id)
		if !poison(id) || seen[*p.DedupeID] {
			t.Errorf("unexpected parked row %+v", p)
		}
		seen[*p.DedupeID] = true
	}
	if len(parked) != nPoison {
		t.Errorf("%d parked rows, want the %d poison messages", len(parked), nPoison)
	}
}
