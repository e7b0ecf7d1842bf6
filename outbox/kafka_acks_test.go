package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/outbox/internal/sinktest"
	kafkago "github.com/segmentio/kafka-go"
)

// TestKafkaSinkWriterSettings: for each Writer setting a user could pass,
// NewKafkaSink either refuses it with an error that says what to set, or
// nothing the relay marks published is missing from the topic, as a
// foreign read-committed reader (franz-go) sees it. A message over the
// topic's max.message.bytes is parked with the broker's reason and holds
// its key's later message back, whatever the batching.
func TestKafkaSinkWriterSettings(t *testing.T) {
	k := kafkatest.New(t)
	cases := []struct {
		name    string
		set     func(w *kafkago.Writer)
		refused string // what the error must name; "" when the setting is accepted
	}{
		{"RequiredAcks left zero (RequireNone)", func(w *kafkago.Writer) { w.RequiredAcks = 0 }, "RequireAll"},
		{"RequiredAcks RequireNone", func(w *kafkago.Writer) { w.RequiredAcks = kafkago.RequireNone }, "RequireAll"},
		{"RequiredAcks out of range", func(w *kafkago.Writer) { w.RequiredAcks = 2 }, "RequiredAcks"},
		{"Async", func(w *kafkago.Writer) { w.Async = true }, "Async"},
		{"Completion", func(w *kafkago.Writer) { w.Completion = func([]kafkago.Message, error) {} }, "Completion"},
		{"no Balancer (round robin)", func(w *kafkago.Writer) { w.Balancer = nil }, "Balancer"},
		{"RoundRobin", func(w *kafkago.Writer) { w.Balancer = &kafkago.RoundRobin{} }, "Balancer"},
		{"LeastBytes", func(w *kafkago.Writer) { w.Balancer = &kafkago.LeastBytes{} }, "Balancer"},
		{"no Topic", func(w *kafkago.Writer) { w.Topic = "" }, "Topic"},
		{"no Addr", func(w *kafkago.Writer) { w.Addr = nil }, "Addr"},
		{"MetadataTopics without the Topic", func(w *kafkago.Writer) { w.Transport.(*kafkago.Transport).MetadataTopics = []string{"other"} }, "MetadataTopics"},
		{"MetadataTopics with the Topic", func(w *kafkago.Writer) { w.Transport.(*kafkago.Transport).MetadataTopics = []string{"other", w.Topic} }, ""},
		{"RequireAll", func(w *kafkago.Writer) {}, ""},
		{"RequireOne", func(w *kafkago.Writer) { w.RequiredAcks = kafkago.RequireOne }, ""},
		{"small requests", func(w *kafkago.Writer) { w.BatchSize, w.BatchBytes = 3, 2500 }, ""},
		{"one attempt", func(w *kafkago.Writer) { w.MaxAttempts = 1 }, ""},
		{"compressed", func(w *kafkago.Writer) { w.Compression = kafkago.Snappy }, ""},
		{"Murmur2Balancer", func(w *kafkago.Writer) { w.Balancer = &kafkago.Murmur2Balancer{} }, ""},
		{"CRC32Balancer", func(w *kafkago.Writer) { w.Balancer = &kafkago.CRC32Balancer{} }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			topic := kafkatest.Name("acks")
			w := k.Writer(topic)
			w.Balancer = &kafkago.Hash{}
			tc.set(w)
			t.Cleanup(func() { _ = w.Close() })
			sink, err := outbox.NewKafkaSink(w)
			if tc.refused != "" {
				if err == nil {
					t.Fatalf("NewKafkaSink accepted a Writer with %s", tc.name)
				}
				if !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("the error does not name %s: %v", tc.refused, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			sinktest.CheckNothingLost(t, k, topic, sink)
		})
	}
}

// TestKafkaSinkTopicLimitBelowBatchBytes: a topic whose max.message.bytes
// (4 KiB) is far below the Writer's BatchBytes (kafka-go's 1 MiB) refuses
// the sink's first requests as too large; the sink cuts them until they
// pass, so every message is published, none parked, in order, and it
// sends requests the topic takes from then on.
func TestKafkaSinkTopicLimitBelowBatchBytes(t *testing.T) {
	sink := sinktest.CheckTopicLimit(t, newKafkaSink).(*outbox.KafkaSink)
	if got := sink.MaxRequestBytes(); got > 4096 {
		t.Fatalf("the sink still sends requests of up to %d bytes", got)
	}
}

// TestKafkaSinkRefusedMessageHoldsOnlyWhatFollows: a message over
// BatchBytes, refused without being sent, fails the later messages of its
// key and not the earlier ones, even when the request those went in is
// refused as too large by the topic and cut and sent again.
func TestKafkaSinkRefusedMessageHoldsOnlyWhatFollows(t *testing.T) {
	k := kafkatest.New(t)
	topic := kafkatest.Name("follows")
	sinktest.CreateTopic(t, k, topic, 1, map[string]string{"max.message.bytes": "4096"})
	w := k.Writer(topic)
	w.Balancer, w.BatchBytes = &kafkago.Hash{}, 5000
	sink, err := outbox.NewKafkaSink(w)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []outbox.Message
	for i := range 10 {
		msgs = append(msgs, outbox.Message{Key: []byte("a"), Value: make([]byte, 100), ID: fmt.Sprintf("a-%d", i)})
	}
	msgs = append(msgs, outbox.Message{Key: []byte("a"), Value: make([]byte, 6000), ID: "a-big"},
		outbox.Message{Key: []byte("a"), Value: make([]byte, 100), ID: "a-after"})
	for i := range 26 {
		msgs = append(msgs, outbox.Message{Key: []byte("b"), Value: make([]byte, 100), ID: fmt.Sprintf("b-%d", i)})
	}
	err = sink.Publish(context.Background(), msgs)
	var pe outbox.PublishErrors
	if !errors.As(err, &pe) || len(pe) != 2 || !outbox.IsPermanent(pe[10]) || pe[11] == nil || outbox.IsPermanent(pe[11]) {
		t.Fatalf("Publish: %v; want a-big refused for good and a-after held behind it, nothing else", err)
	}
	if got := sink.MaxRequestBytes(); got >= 5000 {
		t.Fatalf("no request was refused as too large (the sink still sends up to %d bytes)", got)
	}
}
