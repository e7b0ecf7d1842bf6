package franzsink_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/outbox/internal/sinktest"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestRefusedBatchHoldsTheRestOfItsKey: one Publish of many messages of
// one key, in record batches small enough that the first is full long
// before the last message is handed to the client, and a broker that
// refuses the first produce request for good. No message after the first
// failed one may be reported published (nor be in the topic ahead of it):
// the client must hold every message of the call until all are buffered.
func TestRefusedBatchHoldsTheRestOfItsKey(t *testing.T) {
	k := kafkatest.New(t)
	fake := k.Fake()
	if fake == nil {
		t.Skip("needs the in-process cluster to inject broker failures")
	}
	topic := kafkatest.Name("hold")
	sinktest.CreateTopic(t, k, topic, 1, nil)
	sink := open(t, topic, kgo.SeedBrokers(k.Brokers()...), kgo.ProducerBatchMaxBytes(1024))
	ctx := context.Background()
	// The client learns the topic's metadata first, so the next Publish's
	// records go to their partition as they are handed over.
	if err := sink.Publish(ctx, []outbox.Message{{Key: []byte("warm"), Value: []byte("up"), ID: "warm"}}); err != nil {
		t.Fatal(err)
	}
	faults := fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.UnknownServerError, Count: 1,
		When: sinktest.ProducesTo(fake, topic)})
	defer faults.Remove()
	var msgs []outbox.Message
	for i := range 5000 {
		msgs = append(msgs, outbox.Message{Key: []byte("a"), Value: make([]byte, 200), ID: fmt.Sprintf("a-%d", i)})
	}
	err := sink.Publish(ctx, msgs)
	if faults.Hits() != 1 {
		t.Fatalf("the fault was hit %d times", faults.Hits())
	}
	var pe outbox.PublishErrors
	if !errors.As(err, &pe) {
		t.Fatalf("Publish: %v; want some messages failed", err)
	}
	first := len(msgs)
	for i := range msgs {
		if pe[i] != nil {
			first = i
			break
		}
	}
	for i := first + 1; i < len(msgs); i++ {
		if pe[i] == nil {
			t.Fatalf("%s was reported published after %s failed (%v)", msgs[i].ID, msgs[first].ID, pe[first])
		}
	}
	t.Logf("%d published, %d failed from %s on", first, len(msgs)-first, msgs[first].ID)
}

// TestTooLargeForTheClientHoldsItsKey: a message larger than the client's
// record batch (which franz-go would fail on its own, not the records
// behind it) is refused for good without being sent, and its key's next
// message is not sent either; another key's message is.
func TestTooLargeForTheClientHoldsItsKey(t *testing.T) {
	k := kafkatest.New(t)
	topic := kafkatest.Name("toolarge")
	sinktest.CreateTopic(t, k, topic, 1, nil)
	sink := open(t, topic, kgo.SeedBrokers(k.Brokers()...), kgo.ProducerBatchMaxBytes(2000))
	err := sink.Publish(context.Background(), []outbox.Message{
		{Key: []byte("a"), Value: make([]byte, 5000), ID: "a-big"},
		{Key: []byte("a"), Value: []byte("after"), ID: "a-after"},
		{Key: []byte("b"), Value: []byte("other"), ID: "b-1"},
	})
	var pe outbox.PublishErrors
	if !errors.As(err, &pe) || len(pe) != 2 || !outbox.IsPermanent(pe[0]) || !errors.Is(pe[0], kerr.MessageTooLarge) ||
		pe[1] == nil || outbox.IsPermanent(pe[1]) {
		t.Fatalf("Publish: %v; want a-big refused for good, a-after held behind it, b-1 published", err)
	}
	recs := sinktest.ReadForeign(t, k, topic, map[string]bool{"b-1": true}, time.Minute)
	for _, r := range recs {
		if r.ID != "b-1" {
			t.Fatalf("%s is in the topic", r.ID)
		}
	}
}
