package sinktest

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/outbox"
)

// Options are what a test asks of the sink it constructs.
type Options struct {
	// BatchBytes, when above zero, is the most bytes one request (or record
	// batch) of the sink carries, and so the largest message it sends
	// (kafka-go: Writer.BatchBytes; franz-go: kgo.ProducerBatchMaxBytes).
	// Zero is the client's default.
	BatchBytes int64
	// Hurried asks for a client that gives up on a produce request after
	// about 200 ms and waits a few milliseconds between tries, for a broker
	// the test makes slow and faulty. Within those bounds the sink keeps
	// its own settings (kafka-go: two attempts; franz-go: its idempotent
	// producer's retries).
	Hurried bool
	// LongMetadataAge asks for a client that keeps the cluster's metadata
	// for an hour unless it decides on its own to read it again (kafka-go:
	// Transport.MetadataTTL; franz-go: kgo.MetadataMaxAge), so that what it
	// read before a topic was created is still what it holds after.
	LongMetadataAge bool
}

// NewSink returns a sink writing to topic on k, and closes what it opened
// when t ends.
type NewSink func(t *testing.T, k *kafkatest.Cluster, topic string, opts Options) outbox.Sink

// Run runs the suite with sinks from newSink.
func Run(t *testing.T, newSink NewSink) {
	t.Run("Basic", func(t *testing.T) { testBasic(t, newSink) })
	t.Run("NothingLost", func(t *testing.T) {
		k := kafkatest.New(t)
		topic := kafkatest.Name("acks")
		CheckNothingLost(t, k, topic, newSink(t, k, topic, Options{}))
	})
	t.Run("TopicLimitBelowBatchBytes", func(t *testing.T) { CheckTopicLimit(t, newSink) })
	t.Run("KeyOrderUnderFailures", func(t *testing.T) { testKeyOrderUnderFailures(t, newSink) })
	t.Run("TopicCreatedLater", func(t *testing.T) { testTopicCreatedLater(t, newSink) })
	t.Run("UnknownTopicFromBroker", func(t *testing.T) { testUnknownTopicFromBroker(t, newSink) })
}

// refusedFor reports whether a park reason names what, whatever the
// client's spelling of the broker's error (kafka-go "Message Size Too
// Large", franz-go "MESSAGE_TOO_LARGE").
func refusedFor(reason, what string) bool {
	r := strings.ToLower(strings.ReplaceAll(reason, "_", " "))
	return strings.Contains(r, what)
}

// testBasic: the Kafka key is the message key, the ID is the
// idempotency-key header beside the message's own headers, an empty value
// stays empty, and a message over the sink's request size, or for a topic
// that does not exist, is parked with the reason, holding back only its
// key.
func testBasic(t *testing.T, newSink NewSink) {
	db, o := setup(t)
	k := kafkatest.New(t)
	ctx := context.Background()
	topic := kafkatest.Name("outbox")
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	emit(t, db, o,
		outbox.Message{Sink: "k", Key: []byte("a"), Value: nil, ID: "a1", Headers: []outbox.Header{{Key: "h", Value: []byte("v")}}},
		outbox.Message{Sink: "k", Key: []byte("big"), Value: make([]byte, 5000), ID: "big1"},
		outbox.Message{Sink: "k", Key: []byte("big"), Value: []byte("after"), ID: "big2"},
		outbox.Message{Sink: "k", Key: []byte("a"), Value: []byte{}, ID: "a2"},
		outbox.Message{Sink: "missing", Key: []byte("m"), ID: "m1"})
	missing := kafkatest.Name("no-such-topic")
	startRelay(t, db, outbox.RelayConfig{Sinks: map[string]outbox.Sink{
		"k":       newSink(t, k, topic, Options{BatchBytes: 2000}),
		"missing": newSink(t, k, missing, Options{}),
	}})
	waitRows(t, db, 2*time.Minute, 2, `SELECT count(*) FROM effectively.outbox WHERE parked_at IS NOT NULL AND msg_id IN ('big1', 'm1')`)

	got := ReadForeign(t, k, topic, map[string]bool{"a1": true, "a2": true}, 2*time.Minute)
	if len(got) < 2 || got[0].ID != "a1" || got[0].Key != "a" || len(got[0].Value) != 0 || len(got[0].Headers) != 2 ||
		got[0].Headers[0].Key != "h" || string(got[0].Headers[0].Value) != "v" ||
		got[1].ID != "a2" || len(got[1].Value) != 0 {
		t.Fatalf("read %+v", got)
	}
	parked, err := o.Parked(ctx, db, 10)
	if err != nil || len(parked) != 2 || !refusedFor(parked[0].Reason, "too large") || !refusedFor(parked[1].Reason, "unknown topic") {
		t.Fatalf("parked %+v %v", parked, err)
	}
	var waiting int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM effectively.outbox WHERE msg_id = 'big2' AND published_at IS NULL`).Scan(&waiting); err != nil || waiting != 1 {
		t.Fatalf("big2 should wait behind big1: %d %v", waiting, err)
	}
}

// CheckNothingLost publishes, through a relay with sink, small messages of
// two keys and, on a third key, one message over the topic's
// max.message.bytes followed by a small one. Every message marked published
// must be in the topic, each key's first occurrences in emit order; the
// large one must be parked with the broker's reason, and the one after it
// must wait.
func CheckNothingLost(t *testing.T, k *kafkatest.Cluster, topic string, sink outbox.Sink) {
	t.Helper()
	CreateTopic(t, k, topic, 2, map[string]string{"max.message.bytes": "4096"})
	db, o := setup(t)
	big := make([]byte, 6000)
	_, _ = rand.Read(big) // incompressible
	var msgs []outbox.Message
	for i := range 10 {
		for _, key := range []string{"a", "b"} {
			msgs = append(msgs, outbox.Message{Sink: "k", Key: []byte(key), Value: []byte(fmt.Sprintf("%s %d", key, i)), ID: fmt.Sprintf("%s-%d", key, i)})
		}
		if i == 4 {
			msgs = append(msgs, outbox.Message{Sink: "k", Key: []byte("big"), Value: big, ID: "big-1"},
				outbox.Message{Sink: "k", Key: []byte("big"), Value: []byte("after"), ID: "big-2"})
		}
	}
	emit(t, db, o, msgs...)
	startRelay(t, db, outbox.RelayConfig{Sinks: map[string]outbox.Sink{"k": sink}})
	waitAtLeast(t, db, 2*time.Minute, len(msgs)-1,
		`SELECT count(*) FROM effectively.outbox WHERE published_at IS NOT NULL OR parked_at IS NOT NULL`)

	published := publishedIDs(t, db)
	recs := ReadForeign(t, k, topic, published, time.Minute)
	next := map[string]int{}
	seen := map[string]bool{}
	for _, r := range recs {
		if seen[r.ID] || r.Key == "big" {
			seen[r.ID] = true
			continue
		}
		seen[r.ID] = true
		if want := fmt.Sprintf("%s-%d", r.Key, next[r.Key]); r.ID != want {
			t.Fatalf("key %s: read %s where %s was due", r.Key, r.ID, want)
		}
		next[r.Key]++
	}
	var reason string
	var parked bool
	if err := db.QueryRow(context.Background(), `SELECT parked_at IS NOT NULL, coalesce(park_reason, '') FROM effectively.outbox WHERE msg_id = 'big-1'`).Scan(&parked, &reason); err != nil {
		t.Fatal(err)
	}
	if !parked || !refusedFor(reason, "too large") {
		t.Fatalf("the message over max.message.bytes: parked %v, reason %q (published: %v)", parked, reason, published["big-1"])
	}
	if published["big-2"] {
		t.Fatal("big-2 was published ahead of big-1, which is parked")
	}
}

// CheckTopicLimit: a topic whose max.message.bytes (4 KiB) is far below the
// sink's request size (the client's default) refuses requests as too large;
// every message is published all the same, none parked, in order. It
// returns the sink, for checks of its own.
func CheckTopicLimit(t *testing.T, newSink NewSink) outbox.Sink {
	k := kafkatest.New(t)
	topic := kafkatest.Name("limit")
	CreateTopic(t, k, topic, 1, map[string]string{"max.message.bytes": "4096"})
	db, o := setup(t)
	want := map[string]bool{}
	var msgs []outbox.Message
	for i := range 300 {
		id := fmt.Sprintf("a-%d", i)
		want[id] = true
		msgs = append(msgs, outbox.Message{Sink: "k", Key: []byte("a"), Value: make([]byte, 100), ID: id})
	}
	emit(t, db, o, msgs...)
	sink := newSink(t, k, topic, Options{})
	startRelay(t, db, outbox.RelayConfig{Sinks: map[string]outbox.Sink{"k": sink}})
	waitRows(t, db, 2*time.Minute, len(msgs), `SELECT count(*) FROM effectively.outbox WHERE published_at IS NOT NULL`)
	next := 0
	seen := map[string]bool{}
	for _, r := range ReadForeign(t, k, topic, want, time.Minute) {
		if seen[r.ID] {
			continue
		}
		seen[r.ID] = true
		if due := fmt.Sprintf("a-%d", next); r.ID != due {
			t.Fatalf("read %s where %s was due", r.ID, due)
		}
		next++
	}
	return sink
}
