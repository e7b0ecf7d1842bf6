package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A record with a null value (a tombstone of a compacted topic) and a
// record with an empty value, written by a producer that can tell them
// apart (franz-go). The broker keeps them apart, as a franz-go consumer
// shows, and so does the Source: nil for a null key, value or header value,
// a non-nil empty slice for an empty one.
func TestNullAndEmptyValues(t *testing.T) {
	e := newEnv(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers()...), kgo.DefaultProduceTopic(e.topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := []*kgo.Record{
		{Key: nil, Value: nil, Headers: []kgo.RecordHeader{{Key: "h", Value: nil}}},                // offset 0: null key, null value
		{Key: []byte{}, Value: []byte{}, Headers: []kgo.RecordHeader{{Key: "h", Value: []byte{}}}}, // offset 1: empty key, empty value
		{Key: []byte("k"), Value: []byte("v")},                                                     // offset 2
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	// The broker stores what was produced: null and empty differ.
	rd, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers()...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{e.topic: {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var stored []*kgo.Record
	for len(stored) < 3 {
		fs := rd.PollFetches(ctx)
		if err := fs.Err(); err != nil {
			t.Fatal(err)
		}
		stored = append(stored, fs.Records()...)
	}
	if stored[0].Value != nil || stored[0].Key != nil || stored[1].Value == nil || stored[1].Key == nil {
		t.Fatalf("the broker did not keep null and empty apart: null %#v/%#v, empty %#v/%#v",
			stored[0].Key, stored[0].Value, stored[1].Key, stored[1].Value)
	}

	s := e.source()
	var msgs []*consumer.Message
	for len(msgs) < 3 {
		b, err := s.Fetch(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, b.Messages...)
		if err := process(ctx, s, e.pool, b, nil); err != nil {
			t.Fatal(err)
		}
	}
	null, empty := msgs[0], msgs[1]
	if string(msgs[2].Key) != "k" || string(msgs[2].Value) != "v" {
		t.Fatalf("third record: key %q value %q", msgs[2].Key, msgs[2].Value)
	}
	// A null value is reported as nil, a null key as nil.
	if null.Value != nil || null.Key != nil {
		t.Errorf("null key and value reported as %#v and %#v, want nil", null.Key, null.Value)
	}
	// An empty value or key is reported as a non-nil empty slice.
	if empty.Value == nil || len(empty.Value) != 0 || empty.Key == nil || len(empty.Key) != 0 {
		t.Errorf("empty key and value reported as %#v and %#v, want []byte{} for both", empty.Key, empty.Value)
	}
	if v, ok := empty.Header("h"); !ok || v == nil || len(v) != 0 {
		t.Errorf("empty header value reported as %#v (present %v), want []byte{}", v, ok)
	}
	if v, ok := null.Header("h"); !ok || v != nil {
		t.Errorf("null header value reported as %#v (present %v), want nil", v, ok)
	}
}
