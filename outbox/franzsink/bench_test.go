package franzsink_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/outbox/franzsink"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// BenchmarkPublish compares, in one run, franzsink's Publish with a plain
// kgo client's ProduceSync (kgo's defaults, the idempotent producer) and
// with outbox.KafkaSink, each writing the same 1,000 messages (100 keys,
// 100-byte values, the ID header) per operation to a topic of 4
// partitions on kfake. Compare the ratios, not the absolutes.
func BenchmarkPublish(b *testing.B) {
	k := kafkatest.New(b)
	topic := kafkatest.Name("bench")
	if err := k.CreateTopic(context.Background(), topic, 4); err != nil {
		b.Fatal(err)
	}
	msgs := make([]outbox.Message, 1000)
	for i := range msgs {
		msgs[i] = outbox.Message{Key: []byte(fmt.Sprint("key-", i%100)), Value: make([]byte, 100), ID: fmt.Sprint("id-", i)}
	}
	ctx := context.Background()
	sink, err := franzsink.New(franzsink.Config{Topic: topic, Opts: []kgo.Opt{kgo.SeedBrokers(k.Brokers()...)}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(sink.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cl.Close)
	w := k.Writer(topic)
	w.Balancer, w.BatchSize = &kafkago.Hash{}, 1000
	b.Cleanup(func() { _ = w.Close() })
	kafkaSink, err := outbox.NewKafkaSink(w)
	if err != nil {
		b.Fatal(err)
	}
	report := func(b *testing.B) {
		b.ReportMetric(float64(b.N*len(msgs))/b.Elapsed().Seconds(), "msgs/s")
	}
	b.Run("franzsink", func(b *testing.B) {
		for b.Loop() {
			if err := sink.Publish(ctx, msgs); err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})
	b.Run("kgo_ProduceSync", func(b *testing.B) {
		for b.Loop() {
			recs := make([]*kgo.Record, len(msgs))
			for i := range msgs {
				m := &msgs[i]
				recs[i] = &kgo.Record{Key: m.Key, Value: m.Value, Headers: []kgo.RecordHeader{{Key: outbox.IDHeader, Value: []byte(m.ID)}}}
			}
			if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})
	b.Run("KafkaSink", func(b *testing.B) {
		for b.Loop() {
			if err := kafkaSink.Publish(ctx, msgs); err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})
}
