package ledger_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/examples/readme/ledger"
	"github.com/effectively-once/effectively/pgtest"
)

// TestMain stops the throwaway PostgreSQL server when the tests are done.
func TestMain(m *testing.M) { pgtest.Main(m) }

func TestEachTransferIsBookedOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t) // an empty database of its own (on $TEST_DATABASE_URL, if set)
	if _, err := pool.Exec(ctx, ledger.Table); err != nil {
		t.Fatal(err)
	}

	// An at-least-once broker: it delivers 30% of the messages twice, and loses the
	// acknowledgements of 20% of the batches, as when a worker dies between its
	// commit and its ack, so their lane delivers them all again.
	broker := consumertest.New(consumertest.Config{DuplicateRate: 0.3, LostAckRate: 0.2})
	for i := range 100 {
		body := fmt.Sprintf(`{"transfer_id": "t-%d", "account": "a-%d", "amount": 10}`, i, i%7)
		broker.Publish(i, consumer.Message{Value: []byte(body)}) // to lane i mod 4
	}
	// The producer sent t-5 twice, and a message that does not decode.
	broker.Publish(0, consumer.Message{Value: []byte(`{"transfer_id": "t-5", "account": "a-5", "amount": 10}`)})
	broker.Publish(1, consumer.Message{Value: []byte(`{"transfer_id": "t-x", "account": "a-1", "amount": "ten"}`)})

	c, err := ledger.NewConsumer(pool, broker)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	consumertest.RunUntilIdle(t, c, broker, time.Minute) // until every message is acknowledged

	if broker.Redelivered() == 0 {
		t.Fatal("the broker redelivered nothing: this run proves nothing")
	}
	booked := consumertest.EffectCounts(t, pool, "ledger", "transfer_id")
	if len(booked) != 100 {
		t.Errorf("%d transfers booked, want 100", len(booked))
	}
	for id, n := range booked {
		if n != 1 {
			t.Errorf("transfer %s booked %d times", id, n)
		}
	}
	// The message that does not decode is parked whole, with the reason, not retried.
	parked := consumertest.Parked(t, pool, "", "") // the default schema and table
	if len(parked) != 1 || parked[0].Reason != "permanent" || !strings.Contains(string(parked[0].Payload), `"t-x"`) {
		t.Errorf("parked: %v, want t-x, permanent", parked)
	}
}
