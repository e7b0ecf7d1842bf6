package outbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
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
			sink, err := NewKafkaSink(w)
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
			checkNothingLost(t, k, topic, sink)
		})
	}
}

// checkNothingLost publishes, through a relay with sink, small messages of
// two keys and, on a third key, one message over the topic's
// max.message.bytes followed by a small one. Every message marked published
// must be in the topic; the large one must be parked with the broker's
// reason, and the one after it must wait.
func checkNothingLost(t *testing.T, k *kafkatest.Cluster, topic string, sink Sink) {
	t.Helper()
	createTopic(t, k, topic, 2, map[string]string{"max.message.bytes": "4096"})
	db, o := setup(t, Config{Mode: TableMode})
	big := make([]byte, 6000)
	_, _ = rand.Read(big) // incompressible
	var msgs []Message
	for i := range 10 {
		for _, key := range []string{"a", "b"} {
			msgs = append(msgs, Message{Sink: "k", Key: []byte(key), Value: []byte(fmt.Sprintf("%s %d", key, i)), ID: fmt.Sprintf("%s-%d", key, i)})
		}
		if i == 4 {
			msgs = append(msgs, Message{Sink: "k", Key: []byte("big"), Value: big, ID: "big-1"},
				Message{Sink: "k", Key: []byte("big"), Value: []byte("after"), ID: "big-2"})
		}
	}
	emit(t, db, o, msgs...)
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"k": sink}})
	waitAtLeast(t, db, 2*time.Minute, len(msgs)-1,
		`SELECT count(*) FROM effectively.outbox WHERE published_at IS NOT NULL OR parked_at IS NOT NULL`)

	published := publishedIDs(t, db)
	recs := readForeign(t, k, topic, published, time.Minute)
	// Each key's first occurrences in the topic follow its emit order.
	next := map[string]int{}
	seen := map[string]bool{}
	for _, r := range recs {
		if seen[r.id] || r.key == "big" {
			seen[r.id] = true
			continue
		}
		seen[r.id] = true
		if want := fmt.Sprintf("%s-%d", r.key, next[r.key]); r.id != want {
			t.Fatalf("key %s: read %s where %s was due", r.key, r.id, want)
		}
		next[r.key]++
	}
	var reason string
	var parked bool
	if err := db.QueryRow(context.Background(), `SELECT parked_at IS NOT NULL, coalesce(park_reason, '') FROM effectively.outbox WHERE msg_id = 'big-1'`).Scan(&parked, &reason); err != nil {
		t.Fatal(err)
	}
	if !parked || !strings.Contains(reason, "Message Size Too Large") {
		t.Fatalf("the message over max.message.bytes: parked %v, reason %q (published: %v)", parked, reason, published["big-1"])
	}
	if published["big-2"] {
		t.Fatal("big-2 was published ahead of big-1, which is parked")
	}
}

// TestKafkaSinkTopicLimitBelowBatchBytes: a topic whose max.message.bytes
// (4 KiB) is far below the Writer's BatchBytes (kafka-go's 1 MiB) refuses
// the sink's first requests as too large; the sink cuts them until they
// pass, so every message is published, none parked, in order.
func TestKafkaSinkTopicLimitBelowBatchBytes(t *testing.T) {
	k := kafkatest.New(t)
	topic := kafkatest.Name("limit")
	createTopic(t, k, topic, 1, map[string]string{"max.message.bytes": "4096"})
	db, o := setup(t, Config{Mode: TableMode})
	want := map[string]bool{}
	var msgs []Message
	for i := range 300 {
		id := fmt.Sprintf("a-%d", i)
		want[id] = true
		msgs = append(msgs, Message{Sink: "k", Key: []byte("a"), Value: make([]byte, 100), ID: id})
	}
	emit(t, db, o, msgs...)
	w := k.Writer(topic)
	w.Balancer, w.BatchBytes, w.BatchSize = &kafkago.Hash{}, 0, 1000
	sink, err := NewKafkaSink(w)
	if err != nil {
		t.Fatal(err)
	}
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"k": sink}})
	waitRows(t, db, 2*time.Minute, len(msgs), `SELECT count(*) FROM effectively.outbox WHERE published_at IS NOT NULL`)
	next := 0
	seen := map[string]bool{}
	for _, r := range readForeign(t, k, topic, want, time.Minute) {
		if seen[r.id] {
			continue
		}
		seen[r.id] = true
		if due := fmt.Sprintf("a-%d", next); r.id != due {
			t.Fatalf("read %s where %s was due", r.id, due)
		}
		next++
	}
	if got := sink.maxBytes.Load(); got > 4096 {
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
	createTopic(t, k, topic, 1, map[string]string{"max.message.bytes": "4096"})
	w := k.Writer(topic)
	w.Balancer, w.BatchBytes = &kafkago.Hash{}, 5000
	sink, err := NewKafkaSink(w)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []Message
	for i := range 10 {
		msgs = append(msgs, Message{Key: []byte("a"), Value: make([]byte, 100), ID: fmt.Sprintf("a-%d", i)})
	}
	msgs = append(msgs, Message{Key: []byte("a"), Value: make([]byte, 6000), ID: "a-big"},
		Message{Key: []byte("a"), Value: make([]byte, 100), ID: "a-after"})
	for i := range 26 {
		msgs = append(msgs, Message{Key: []byte("b"), Value: make([]byte, 100), ID: fmt.Sprintf("b-%d", i)})
	}
	err = sink.Publish(context.Background(), msgs)
	var pe PublishErrors
	if !errors.As(err, &pe) || len(pe) != 2 || !IsPermanent(pe[10]) || pe[11] == nil || IsPermanent(pe[11]) {
		t.Fatalf("Publish: %v; want a-big refused for good and a-after held behind it, nothing else", err)
	}
	if got := sink.maxBytes.Load(); got >= 5000 {
		t.Fatalf("no request was refused as too large (the sink still sends up to %d bytes)", got)
	}
}
