package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/dedupe/idset"
)

// Every strategy works in the consumer with nothing but Migrate and Run:
// the consumer runs the strategy's maintenance and warm-up itself.
func TestEveryStrategyThroughTheConsumer(t *testing.T) {
	t.Parallel()
	strategies := map[string]func() (dedupe.Strategy, error){
		"idset": func() (dedupe.Strategy, error) { return idset.New(idset.Config{}) },
		"highwater": func() (dedupe.Strategy, error) {
			return highwater.New(highwater.Config{Mode: highwater.Monotonic})
		},
		// An hour of one-minute slices: the default retention of a week
		// would be 10,000 partitions, each sealed at start-up.
		"bloom": func() (dedupe.Strategy, error) {
			return bloom.New(bloom.Config{Slice: time.Minute, Retention: time.Hour})
		},
	}
	for name, mk := range strategies {
		for _, queued := range []bool{false, true} {
			runStrategy(t, name, mk, queued)
		}
	}
}

// runStrategy runs three senders' messages with duplicates through a
// consumer with the strategy mk makes, with a Handler or a QueueHandler.
func runStrategy(t *testing.T, name string, mk func() (dedupe.Strategy, error), queued bool) {
	t.Run(name+map[bool]string{false: "-Handler", true: "-QueueHandler"}[queued], func(t *testing.T) {
		t.Parallel()
		s, err := mk()
		if err != nil {
			t.Fatal(err)
		}
		e := newEnv(t, consumertest.Config{Lanes: 3, DuplicateRate: 0.3, LostAckRate: 0.05})
		const senders, per = 3, 100
		for sender := range senders {
			for seq := 1; seq <= per; seq++ {
				e.broker.Publish(sender, seqMsg(fmt.Sprintf("s%d", sender), seq))
			}
		}
		cfg := consumer.Config{Strategy: s, BatchSize: 25}
		if queued {
			cfg.QueueHandler = queueEffect
		}
		if name == "highwater" {
			cfg.KeyFunc = seqKey
		}
		e.runUntilIdle(e.consumer(cfg), time.Minute)
		e.checkOnceEach(senders * per)
	})
}

// A consumer using idset runs its retention sweeper, unless told not to.
func TestConsumerSweepsExpiredIDSetMarkers(t *testing.T) {
	t.Parallel()
	for _, manual := range []bool{false, true} {
		t.Run(fmt.Sprintf("manual=%v", manual), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, consumertest.Config{Lanes: 1})
			s, err := idset.New(idset.Config{Retention: time.Hour, SweepInterval: 20 * time.Millisecond, ManualSweep: manual})
			if err != nil {
				t.Fatal(err)
			}
			c := e.consumer(consumer.Config{Strategy: s})
			ctx := context.Background()
			if _, err := e.pool.Exec(ctx, `INSERT INTO effectively.processed (scope, id, processed_at)
				SELECT 'old', 'k' || g, now() - interval '2 hours' FROM generate_series(1, 50) g`); err != nil {
				t.Fatal(err)
			}
			e.broker.Publish(0, msg("fresh", "fresh"))
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(runCtx) }()
			// Wait for the message, then give a running sweeper a few rounds.
			var old int
			deadline := time.Now().Add(5 * time.Second)
			for {
				if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM effectively.processed WHERE scope = 'old'`).Scan(&old); err != nil {
					t.Fatal(err)
				}
				idle := e.broker.Idle()
				if idle && (old == 0 || (manual && time.Now().After(deadline.Add(-4*time.Second)))) || time.Now().After(deadline) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			stop()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			switch {
			case !manual && old != 0:
				t.Errorf("%d expired markers left: the consumer did not sweep", old)
			case manual && old != 50:
				t.Errorf("%d of 50 expired markers left with ManualSweep", old)
			}
			if !e.markerExists("test", "fresh") {
				t.Error("the fresh marker was swept")
			}
		})
	}
}
