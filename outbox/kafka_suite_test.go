package outbox_test

import (
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/outbox/internal/sinktest"
	kafkago "github.com/segmentio/kafka-go"
)

// newKafkaSink is the suite's constructor for KafkaSink: a kafka-go Writer
// with a key-hashing Balancer and RequireAll (kafkatest's Writer), and,
// hurried, two attempts a request of at most 200 ms each, a few
// milliseconds apart; with a long metadata age, a Transport whose
// MetadataTTL is an hour.
func newKafkaSink(t *testing.T, k *kafkatest.Cluster, topic string, opts sinktest.Options) outbox.Sink {
	t.Helper()
	w := k.Writer(topic)
	w.Balancer = &kafkago.Hash{}
	if opts.BatchBytes > 0 {
		w.BatchBytes = opts.BatchBytes
	}
	if opts.Hurried {
		w.MaxAttempts = 2
		w.WriteBackoffMin, w.WriteBackoffMax = time.Millisecond, 5*time.Millisecond
		w.WriteTimeout = 200 * time.Millisecond
	}
	if opts.LongMetadataAge {
		w.Transport.(*kafkago.Transport).MetadataTTL = time.Hour
	}
	t.Cleanup(func() { _ = w.Close() })
	s, err := outbox.NewKafkaSink(w)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestKafkaSinkConformance runs the sink suite every Kafka sink runs.
func TestKafkaSinkConformance(t *testing.T) { sinktest.Run(t, newKafkaSink) }
