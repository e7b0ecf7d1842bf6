package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
)

// TestClassifyAgreesWithTheConsumer checks that Classify, the replay dry
// run's view, predicts what the consumer then does with the same batch:
// it runs the consumer's own path, so the two cannot disagree.
func TestClassifyAgreesWithTheConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	cfg := e.config(consumer.Config{BatchSize: 100})
	e.broker.Publish(0, msg("a", "a"))
	e.broker.Publish(0, msg("b", "b"))
	e.runUntilIdle(consumertest.NewConsumer(t, e.pool, e.broker, cfg), 30*time.Second)
	before := e.hooks.Total()

	batch := []consumer.Message{
		msg("a", "a"),         // applied before: duplicate
		msg("b", "changed"),   // applied before with another payload: mismatch
		msg("c", "c"),         // new
		msg("c", "c"),         // a copy in the same batch: duplicate
		{Value: []byte("no")}, // no key: parked
		msg("d", "d"),         // new
	}
	msgs := make([]*consumer.Message, len(batch))
	for i := range batch {
		m := batch[i]
		msgs[i] = &m
	}
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cls, err := consumer.Classify(ctx, tx, cfg, msgs)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	want := []consumer.Outcome{consumer.OutcomeDuplicate, consumer.OutcomeMismatch, consumer.OutcomeApplied,
		consumer.OutcomeDuplicate, consumer.OutcomeParked, consumer.OutcomeApplied}
	predicted := map[consumer.Outcome]int{}
	for i, cl := range cls {
		if cl.Outcome != want[i] {
			t.Errorf("message %d: classified %s, want %s (%+v)", i, cl.Outcome, want[i], cl)
		}
		if (cl.Err != nil) != (cl.Outcome == consumer.OutcomeParked) {
			t.Errorf("message %d: outcome %s with key error %v", i, cl.Outcome, cl.Err)
		}
		predicted[cl.Outcome]++
	}

	for _, m := range batch {
		e.broker.Publish(0, m)
	}
	e.runUntilIdle(consumertest.NewConsumer(t, e.pool, e.broker, cfg), 30*time.Second)
	after := e.hooks.Total()
	got := map[consumer.Outcome]int{
		consumer.OutcomeApplied:   after.Applied - before.Applied,
		consumer.OutcomeDuplicate: after.Duplicate - before.Duplicate,
		consumer.OutcomeMismatch:  after.Mismatch - before.Mismatch,
		consumer.OutcomeParked:    after.Parked - before.Parked,
	}
	for o, n := range got {
		if predicted[o] != n {
			t.Errorf("%s: the consumer reported %d, Classify predicted %d", o, n, predicted[o])
		}
	}
	if got := e.effectCounts(); got["c"] != 1 || got["d"] != 1 || got["a"] != 1 {
		t.Errorf("effects %v: the rolled-back classification must leave no marker behind", got)
	}
}
