package sqs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/sqs"
	"github.com/jackc/pgx/v5"
)

// The SQS source under the engine through PgBouncer in transaction
// pooling: a first process commits its batches and dies before each
// delete, a second receives everything again, and a poison message is
// parked. Every message has exactly one effect, the redelivered ones are
// duplicates, and the queue ends empty.
func TestCrashAndPoisonThroughPgBouncer(t *testing.T) {
	t.Parallel()
	c := client(t)
	e := newE2EOn(t, fauxqs.NewQueue(t, c, "bouncer", nil), pgtest.NewBouncerPool(t, nil))
	msgs := keyed("m", 40)
	poison := keyed("poison", 1)
	send(t, c, e.queue, msgs[:20])
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.DedupeKey.ID == poison[0].Body {
			return consumer.Permanent(errors.New("cannot handle it"))
		}
		return insertEffect(ctx, tx, m)
	}

	first := &faultySource{Source: e.source(sqs.Config{Receivers: 2}), drop: func(*consumer.Message) bool { return true }}
	r := consumertest.Start(e.consumer(first, consumer.Config{BatchSize: 10, Handler: handler}))
	e.waitFor("the first 20 committed", 20*time.Second, func() bool { return len(e.effectCounts()) == 20 })
	r.Stop(t)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	send(t, c, e.queue, append(msgs[20:], poison...))
	r = consumertest.Start(e.consumer(e.source(sqs.Config{Receivers: 2}), consumer.Config{BatchSize: 10, Handler: handler}))
	e.waitFor("everything settled", 30*time.Second, func() bool { return e.drained(len(msgs))() && len(e.parked()) == 1 })
	r.Stop(t)

	e.expectOnce(bodiesOf(msgs))
	if st := e.hooks.Total(); st.Duplicate < 20 || st.Parked != 1 {
		t.Fatalf("stats %+v: want the 20 redelivered messages recognised as duplicates and the poison parked", st)
	}
}
