package outbox

import (
	"testing"

	"github.com/effectively-once/effectively/internal/kafkatest"
	kafkago "github.com/segmentio/kafka-go"
)

func kafkaSink(t *testing.T, k *kafkatest.Cluster, topic string, batchBytes int64) *KafkaSink {
	t.Helper()
	w := k.Writer(topic)
	w.Balancer = &kafkago.Hash{}
	if batchBytes > 0 {
		w.BatchBytes = batchBytes
	}
	t.Cleanup(func() { _ = w.Close() })
	s, err := NewKafkaSink(w)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
