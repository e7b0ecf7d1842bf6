package consumer_test

import (
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
		"bloom": func() (dedupe.Strategy, error) { return bloom.New(bloom.Config{Slice: time.Minute}) },
	}
	for name, mk := range strategies {
		t.Run(name, func(t *testing.T) {
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
			if name == "highwater" {
				cfg.KeyFunc = seqKey
			}
			e.runUntilIdle(e.consumer(cfg), time.Minute)
			counts := e.effectCounts()
			if len(counts) != senders*per {
				t.Errorf("%d messages applied, want %d", len(counts), senders*per)
			}
			for id, n := range counts {
				if n != 1 {
					t.Errorf("%s applied %d times", id, n)
				}
			}
			if st := e.hooks.Total(); st.Duplicate == 0 {
				t.Error("no duplicates seen: the test did not test dedupe")
			}
		})
	}
}
