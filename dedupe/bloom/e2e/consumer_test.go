// Package e2e_test runs the bloom strategy through the consumer engine. It
// lives apart from the strategy's own tests so that those do not depend on
// the consumer package.
package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// waitForNextSlice sleeps until just after the next boundary of slice.
func waitForNextSlice(slice time.Duration) {
	now := time.Now()
	time.Sleep(now.Truncate(slice).Add(slice).Sub(now) + 20*time.Millisecond)
}

var errCrash = errors.New("consumer crashed mid-handler")

// TestConsumerInvariant is the promise through the consumer engine: 8,000
// logical messages, a quarter of them published twice on different lanes
// and a twentieth again in a later slice,
// delivered with broker duplicates, lost acknowledgements and crashes, to
// two consumers at a time, each with its own Strategy (two processes whose
// filters differ), restarted with new strategies (and Warm) several times,
// over one-second slices that close, seal and rotate during the run: every
// message has exactly one effect.
func TestConsumerInvariant(t *testing.T) {
	t.Parallel()
	const n = 8000
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL)`); err != nil { // no unique constraint: a second effect must be countable
		t.Fatal(err)
	}
	broker := consumertest.New(consumertest.Config{Lanes: 4, DuplicateRate: 0.2, LostAckRate: 0.03, Seed: 5})
	publish := func(from, to int) {
		for i := from; i < to; i++ {
			m := consumer.Message{ID: fmt.Sprint(i), Value: []byte(fmt.Sprint(i))}
			broker.Publish(i, m)
			if i%4 == 0 {
				broker.Publish(i+1, m) // the producer sent it twice
			}
		}
	}
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	handler := func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		mu.Lock()
		crash := rng.Float64() < 0.02
		mu.Unlock()
		if crash {
			broker.Crash()
			return errCrash
		}
		ids := make([]string, len(msgs))
		for i, m := range msgs {
			ids[i] = m.ID
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects SELECT unnest($1::text[])`, ids)
		return err
	}
	cfg := bloom.Config{Slice: time.Second, Retention: time.Minute}

	// run runs consumers, two at a time, each with a strategy of its own,
	// in lifetimes of a few hundred milliseconds, until the broker is idle.
	var strategies []*bloom.Strategy
	run := func() {
		deadline := time.Now().Add(time.Minute)
		for lifetime := 0; !broker.Idle(); lifetime++ {
			if time.Now().After(deadline) {
				t.Fatalf("not done after %d lifetimes: %d unacknowledged", lifetime, broker.Unacked())
			}
			runCtx, cancel := context.WithTimeout(ctx, time.Duration(150+lifetime*100)*time.Millisecond)
			var wg sync.WaitGroup
			for range 2 {
				s, err := bloom.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				strategies = append(strategies, s)
				if _, err := pg.Migrate(ctx, pool, "", s.Migrations()...); err != nil {
					t.Fatal(err)
				}
				if err := s.Maintain(ctx, pool); err != nil {
					t.Fatal(err)
				}
				if err := s.Warm(ctx, pool); err != nil {
					t.Fatal(err)
				}
				c := consumertest.NewConsumer(t, pool, broker, consumer.Config{
					Name: "bloom-e2e", Strategy: s, BatchHandler: handler, BatchSize: 50, MaxAttempts: 100,
					RetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond,
				})
				wg.Go(func() { _ = s.RunMaintenance(runCtx, pool) })
				wg.Go(func() {
					if err := c.Run(runCtx); err != nil {
						t.Error(err)
					}
				})
			}
			go func() {
				for runCtx.Err() == nil && !broker.Idle() {
					time.Sleep(5 * time.Millisecond)
				}
				cancel()
			}()
			wg.Wait()
			cancel()
		}
	}
	// The first half, then, in a later slice (the first half's slices
	// closed), the second half with every tenth message of the first half
	// published again: those duplicates are found through sealed filters
	// built by other strategies than the ones that wrote them.
	publish(0, n/2)
	run()
	waitForNextSlice(time.Second)
	publish(n/2, n)
	for i := 0; i < n/2; i += 10 {
		broker.Publish(i, consumer.Message{ID: fmt.Sprint(i), Value: []byte(fmt.Sprint(i))})
	}
	run()

	st := broker.Stats()
	t.Logf("%d messages: %d deliveries, %d duplicated by the broker, %d lost acks, %d crashes",
		n, st.Delivered, st.Duplicated, st.LostAcks, st.Crashes)
	if st.Crashes == 0 || st.LostAcks == 0 {
		t.Errorf("the run had %d crashes and %d lost acks; want some of each", st.Crashes, st.LostAcks)
	}
	var saved, sealed, confirmed int64
	for _, s := range strategies {
		saved += s.Stats().ProbesSaved
		sealed += s.Stats().Sealed
		confirmed += s.Stats().ConfirmedPositives
	}
	if len(strategies) < 4 {
		t.Errorf("only %d strategies ran: want at least one restart", len(strategies))
	}
	t.Logf("%d strategies sealed %d slices, saved %d probes, confirmed %d positives", len(strategies), sealed, saved, confirmed)
	if saved == 0 || confirmed == 0 {
		t.Error("the filters saved no probe or confirmed no duplicate: the run did not exercise them")
	}
	counts := consumertest.EffectCounts(t, pool, "effects", "msg_id")
	for id, k := range counts {
		if k != 1 {
			t.Errorf("message %s has %d effects", id, k)
		}
	}
	if len(counts) != n {
		t.Errorf("%d messages have effects, want %d", len(counts), n)
	}
}
