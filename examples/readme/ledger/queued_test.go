package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/examples/readme/ledger"
	"github.com/effectively-once/effectively/pgtest"
)

// The QueueHandler version books each transfer once too, and parks the
// message that does not decode.
func TestQueuedConsumerBooksEachTransferOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	if _, err := pool.Exec(ctx, ledger.Table); err != nil {
		t.Fatal(err)
	}
	broker := consumertest.New(consumertest.Config{DuplicateRate: 0.3, LostAckRate: 0.2})
	for i := range 100 {
		body := fmt.Sprintf(`{"transfer_id": "t-%d", "account": "a-%d", "amount": 10}`, i, i%7)
		broker.Publish(i, consumer.Message{Value: []byte(body)})
	}
	broker.Publish(1, consumer.Message{Value: []byte(`{"transfer_id": "t-x", "account": "a-1", "amount": "ten"}`)})
	c, err := ledger.NewQueuedConsumer(pool, broker)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	consumertest.RunUntilIdle(t, c, broker, time.Minute)
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
	if parked := consumertest.Parked(t, pool, "", ""); len(parked) != 1 || parked[0].Reason != "permanent" {
		t.Errorf("parked: %v, want t-x, permanent", parked)
	}
}
