package kafka

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/internal/pgtest"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/twmb/franz-go/pkg/kfake"
)

// TestSASL: Config.SASL reaches every connection (group coordinator,
// partition readers, the retention lookup).
func TestSASL(t *testing.T) {
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Skip("needs the in-process cluster, started with SASL")
	}
	mech := plain.Mechanism{Username: "ledger", Password: "s3cret"}
	k := kafkatest.New(t, kfake.EnableSASL(), kfake.Superuser("PLAIN", "ledger", "s3cret"))
	k.UseSASL(mech)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	topic := kafkatest.Name("secure")
	if err := k.CreateTopic(ctx, topic, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := k.Produce(ctx, topic, kafkago.Message{Value: []byte("a")}, kafkago.Message{Value: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, kafka: k, topic: topic, group: kafkatest.Name("g"), partitions: 1, pool: pgtest.NewPool(t)}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL, lane text NOT NULL, off bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	s := e.source(func(c *Config) { c.SASL = mech })
	for seen := 0; seen < 2; {
		b, err := s.Fetch(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		seen += len(b.Messages)
		if err := process(ctx, s, e.pool, b, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.RedeliveryHorizon(); got != time.Hour {
		t.Errorf("RedeliveryHorizon over SASL = %s, want 1h", got)
	}
}
