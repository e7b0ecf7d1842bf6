package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	kafkago "github.com/segmentio/kafka-go"
)

// BenchmarkKafkaPublish compares, in one run, KafkaSink.Publish with a
// plain kafka-go Writer (the same settings, BatchTimeout 5 ms, and again
// with 1 µs, which sends a batch as soon as a call's messages are in it)
// writing the
// same 1,000 messages (100 keys, 100-byte values) per operation to a topic
// of 4 partitions on kfake. Compare the ratio, not the absolutes.
func BenchmarkKafkaPublish(b *testing.B) {
	k := kafkatest.New(b)
	topic := kafkatest.Name("bench")
	if err := k.CreateTopic(context.Background(), topic, 4); err != nil {
		b.Fatal(err)
	}
	msgs := make([]Message, 1000)
	kms := make([]kafkago.Message, len(msgs))
	for i := range msgs {
		msgs[i] = Message{Key: []byte(fmt.Sprint("key-", i%100)), Value: make([]byte, 100), ID: fmt.Sprint("id-", i)}
		kms[i] = kafkaMessage(&msgs[i])
	}
	writer := func() *kafkago.Writer {
		w := k.Writer(topic)
		w.Balancer, w.BatchSize = &kafkago.Hash{}, 1000
		b.Cleanup(func() { _ = w.Close() })
		return w
	}
	sink, err := NewKafkaSink(writer())
	if err != nil {
		b.Fatal(err)
	}
	w := writer()
	quick := writer()
	quick.BatchTimeout = time.Microsecond
	ctx := context.Background()
	b.Run("KafkaSink", func(b *testing.B) {
		for b.Loop() {
			if err := sink.Publish(ctx, msgs); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*len(msgs))/b.Elapsed().Seconds(), "msgs/s")
	})
	for _, v := range []struct {
		name string
		w    *kafkago.Writer
	}{{"Writer", w}, {"Writer_BatchTimeout_1us", quick}} {
		b.Run(v.name, func(b *testing.B) {
			for b.Loop() {
				if err := v.w.WriteMessages(ctx, kms...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(msgs))/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
