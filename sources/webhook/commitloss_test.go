package webhook_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/webhook"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A delivery's COMMIT loses its reply after the server committed it: the
// consumer finds out that it committed, so the provider is answered 200 at
// once (not asked to deliver again), and the event is reported applied,
// not unknown.
func TestCommitLostIsResolved(t *testing.T) {
	loss := &pgtest.CommitLoss{}
	var armed atomic.Bool
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if armed.CompareAndSwap(false, true) {
			loss.Arm()
		}
		return insertEffect(ctx, tx, m)
	}
	e := newEnvWith(t, webhook.Config{}, consumer.Config{Handler: handler},
		func(cfg *pgxpool.Config) { cfg.ConnConfig.DialFunc = loss.Dial })
	e.start()
	defer e.stop()

	r := e.post(event("evt_lost_commit", 100))
	expectStatus(t, "the delivery whose COMMIT lost its reply", r, http.StatusOK)
	if loss.Dropped() != 1 {
		t.Fatalf("%d COMMIT replies lost, want 1: the test did not lose a commit", loss.Dropped())
	}
	if n := e.effects("evt_lost_commit"); n != 1 {
		t.Errorf("the event has %d effects, want 1", n)
	}
	unknown, lost := 0, 0
	for _, b := range e.hooks.Batches() {
		unknown += b.Unknown
		if b.CommitLost && b.Err == nil {
			lost++
		}
	}
	if tot := e.hooks.Total(); tot.Applied != 1 || unknown != 0 || lost != 1 {
		t.Errorf("%s, %d unknown, %d lost COMMITs found committed; want 1 applied, none unknown, 1 found committed", tot, unknown, lost)
	}
}
