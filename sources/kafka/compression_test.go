package kafka

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestCompressedBatches: an idempotent franz-go producer writes batches
// compressed with each codec Kafka knows; every record comes through
// exactly as written: value (null, empty, text and binary), key and
// headers (a null and an empty header value among them), in offset order.
func TestCompressedBatches(t *testing.T) {
	codecs := []struct {
		name  string
		codec kgo.CompressionCodec
	}{
		{"gzip", kgo.GzipCompression()},
		{"snappy", kgo.SnappyCompression()},
		{"lz4", kgo.Lz4Compression()},
		{"zstd", kgo.ZstdCompression()},
	}
	for _, c := range codecs {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const n = 400
			e := newEnv(t, 2)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers()...), kgo.DefaultProduceTopic(e.topic),
				kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchCompression(c.codec),
				kgo.ProducerLinger(50*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()

			rng := rand.New(rand.NewPCG(1, 2))
			want := map[string]*kgo.Record{}
			recs := make([]*kgo.Record, n)
			for i := range recs {
				id := fmt.Sprintf("%s-%d", c.name, i)
				r := &kgo.Record{Partition: int32(i % 2), Key: []byte(fmt.Sprintf("key-%d", i%7))}
				switch i % 5 {
				case 0:
					r.Value = nil // a tombstone
				case 1:
					r.Value = []byte{}
				case 2:
					r.Value = bytes.Repeat([]byte("compressible "), 1+i%40)
				default:
					r.Value = make([]byte, rng.IntN(3000))
					for j := range r.Value {
						r.Value[j] = byte(rng.Uint32())
					}
				}
				if i%3 == 0 {
					r.Key = nil
				}
				r.Headers = []kgo.RecordHeader{
					{Key: DefaultIDHeader, Value: []byte(id)},
					{Key: "null", Value: nil},
					{Key: "empty", Value: []byte{}},
					{Key: "n", Value: []byte(fmt.Sprint(i))},
				}
				recs[i] = r
				want[id] = r
			}
			if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				t.Fatal(err)
			}

			s := e.source()
			last := map[string]int64{}
			seen := map[string]bool{}
			for len(seen) < n {
				b, err := s.Fetch(ctx, 100)
				if err != nil {
					t.Fatalf("after %d of %d records: %v", len(seen), n, err)
				}
				for _, m := range b.Messages {
					_, _, off, _ := Position(m)
					if prev, ok := last[m.Lane]; ok && off <= prev {
						t.Fatalf("%s: offset %d after %d", m.Lane, off, prev)
					}
					last[m.Lane] = off
					r, ok := want[m.ID]
					if !ok || seen[m.ID] {
						t.Fatalf("unexpected message %s (seen before: %v)", m.ID, seen[m.ID])
					}
					seen[m.ID] = true
					checkSame(t, m, r)
				}
				if err := process(ctx, s, e.pool, b, nil); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// checkSame fails t unless m carries r's key, value and headers, with
// null and empty told apart.
func checkSame(t *testing.T, m *consumer.Message, r *kgo.Record) {
	t.Helper()
	same := func(a, b []byte) bool { return (a == nil) == (b == nil) && bytes.Equal(a, b) }
	if !same(m.Value, r.Value) {
		t.Errorf("%s: value %d bytes (nil %v), want %d bytes (nil %v)", m.ID, len(m.Value), m.Value == nil, len(r.Value), r.Value == nil)
	}
	if !same(m.Key, r.Key) {
		t.Errorf("%s: key %q (nil %v), want %q (nil %v)", m.ID, m.Key, m.Key == nil, r.Key, r.Key == nil)
	}
	if len(m.Headers) != len(r.Headers) {
		t.Fatalf("%s: %d headers, want %d", m.ID, len(m.Headers), len(r.Headers))
	}
	for i, h := range r.Headers {
		if m.Headers[i].Key != h.Key || !same(m.Headers[i].Value, h.Value) {
			t.Errorf("%s: header %d is %q=%q (nil %v), want %q=%q (nil %v)", m.ID, i,
				m.Headers[i].Key, m.Headers[i].Value, m.Headers[i].Value == nil, h.Key, h.Value, h.Value == nil)
		}
	}
}
