package sqs_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/sqs"
	"github.com/jackc/pgx/v5"
)

// A batch's COMMIT loses its reply after the server committed it: the
// consumer finds out that it committed, reports its messages applied and
// deletes them, so none is reported unknown and none is delivered again.
func TestCommitLostIsResolved(t *testing.T) {
	t.Parallel()
	c := client(t)
	loss := &pgtest.CommitLoss{}
	e := newE2EOn(t, fauxqs.NewQueue(t, c, "commitloss", nil), loss.Pool(t, pgtest.URL(t)))
	msgs := keyed("m", 30)
	send(t, c, e.queue, msgs)
	var armed atomic.Bool
	handler := func(ctx context.Context, tx pgx.Tx, batch []*consumer.Message) error {
		if armed.CompareAndSwap(false, true) {
			loss.Arm()
		}
		return insertEffects(ctx, tx, batch)
	}
	r := consumertest.Start(e.consumer(e.source(sqs.Config{Receivers: 1}), consumer.Config{BatchSize: 10, BatchHandler: handler}))
	e.waitFor("everything applied and deleted", 30*time.Second, e.drained(len(msgs)))
	r.Stop(t)

	if loss.Dropped() != 1 {
		t.Fatalf("%d COMMIT replies lost, want 1: the test did not lose a commit", loss.Dropped())
	}
	e.expectOnce(bodiesOf(msgs))
	unknown, lost := 0, 0
	for _, b := range e.hooks.Batches() {
		unknown += b.Unknown
		if b.CommitLost && b.Err == nil {
			lost++
		}
	}
	if tot := e.hooks.Total(); tot.Applied != len(msgs) || tot.Duplicate != 0 || unknown != 0 || lost != 1 {
		t.Errorf("stats %+v, %d unknown, %d lost COMMITs found committed: want %d applied, no duplicate, none unknown, 1 found committed",
			tot, unknown, lost, len(msgs))
	}
}
