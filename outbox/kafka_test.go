package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

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

// TestKafkaSink: through kfake, the Kafka key is the message key, the ID is
// the idempotency-key header (kafka-go's Reader does not tell a null value
// from an empty one; TestChained reads them apart through sources/kafka), and a
// message the broker refuses as too large, or for a topic that does not
// exist, is parked with the reason, holding back only its key.
func TestKafkaSink(t *testing.T) {
	if _, err := NewKafkaSink(&kafkago.Writer{}); err == nil {
		t.Fatal("a Writer without a Topic was accepted")
	}
	db, o := setup(t, Config{Mode: TableMode})
	k := kafkatest.New(t)
	ctx := context.Background()
	topic := kafkatest.Name("outbox")
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	emit(t, db, o,
		Message{Sink: "k", Key: []byte("a"), Value: nil, ID: "a1", Headers: []Header{{Key: "h", Value: []byte("v")}}},
		Message{Sink: "k", Key: []byte("big"), Value: make([]byte, 5000), ID: "big1"},
		Message{Sink: "k", Key: []byte("big"), Value: []byte("after"), ID: "big2"},
		Message{Sink: "k", Key: []byte("a"), Value: []byte{}, ID: "a2"},
		Message{Sink: "missing", Key: []byte("m"), ID: "m1"})
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{
		"k":       kafkaSink(t, k, topic, 2000),
		"missing": kafkaSink(t, k, kafkatest.Name("no-such-topic"), 0),
	}})
	waitRows(t, db, 2*time.Minute, 2, `SELECT count(*) FROM effectively.outbox WHERE parked_at IS NOT NULL AND msg_id IN ('big1', 'm1')`)

	r := kafkago.NewReader(kafkago.ReaderConfig{Brokers: k.Brokers(), Topic: topic, Partition: 0, MaxWait: kafkatest.MaxWait})
	defer r.Close()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var got []kafkago.Message
	for len(got) < 2 {
		m, err := r.ReadMessage(rctx)
		if err != nil {
			t.Fatalf("after %d messages: %v", len(got), err)
		}
		got = append(got, m)
	}
	id := func(m kafkago.Message) string {
		for _, h := range m.Headers {
			if h.Key == IDHeader {
				return string(h.Value)
			}
		}
		return ""
	}
	if id(got[0]) != "a1" || string(got[0].Key) != "a" || len(got[0].Value) != 0 || len(got[0].Headers) != 2 ||
		id(got[1]) != "a2" || len(got[1].Value) != 0 {
		t.Fatalf("read %+v", got)
	}
	parked, err := o.Parked(ctx, db, 10)
	if err != nil || len(parked) != 2 || !strings.Contains(parked[0].Reason, "Message Size Too Large") ||
		!strings.Contains(parked[1].Reason, "Unknown Topic") {
		t.Fatalf("parked %+v %v", parked, err)
	}
	var waiting int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM effectively.outbox WHERE msg_id = 'big2' AND published_at IS NULL`).Scan(&waiting); err != nil || waiting != 1 {
		t.Fatalf("big2 should wait behind big1: %d %v", waiting, err)
	}
}
