package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
)

func TestRedeliveryHorizon(t *testing.T) {
	k := kafkatest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	short, long := kafkatest.Name("short"), kafkatest.Name("long")
	if err := k.CreateTopic(ctx, short, 1, 2*time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := k.CreateTopic(ctx, long, 1, 72*time.Hour); err != nil {
		t.Fatal(err)
	}
	s, err := New(nil, Config{Brokers: k.Brokers(), Group: "g", Topics: []string{short, long}, KafkaOffsetsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, err := s.RedeliveryHorizon(ctx); err != nil || got != 72*time.Hour {
		t.Errorf("RedeliveryHorizon = %s, %v; want the longest retention, 72h", got, err)
	}

	missing, err := New(nil, Config{Brokers: k.Brokers(), Group: "g", Topics: []string{kafkatest.Name("missing")}, KafkaOffsetsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer missing.Close()
	if got, err := missing.RedeliveryHorizon(ctx); err == nil {
		t.Errorf("RedeliveryHorizon of a missing topic = %s, want an error", got)
	}
}

// TestRedeliveryHorizonRetries checks that a failed lookup is not kept: the
// topic is missing at the first call and created before the second, which
// must then report its retention.
func TestRedeliveryHorizonRetries(t *testing.T) {
	k := kafkatest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	topic := kafkatest.Name("later")
	s, err := New(nil, Config{Brokers: k.Brokers(), Group: "g", Topics: []string{topic}, KafkaOffsetsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if d, err := s.RedeliveryHorizon(ctx); err == nil {
		t.Fatalf("RedeliveryHorizon of a missing topic = %s, want an error", d)
	}
	if err := k.CreateTopic(ctx, topic, 1, 5*time.Hour); err != nil {
		t.Fatal(err)
	}
	if d, err := s.RedeliveryHorizon(ctx); err != nil || d != 5*time.Hour {
		t.Fatalf("RedeliveryHorizon after the topic was created = %s, %v; want 5h (the failure must not be kept)", d, err)
	}

	cancelled, stop := context.WithCancel(ctx)
	stop()
	other, err := New(nil, Config{Brokers: k.Brokers(), Group: "g", Topics: []string{topic}, KafkaOffsetsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.RedeliveryHorizon(cancelled); err == nil {
		t.Fatal("RedeliveryHorizon with a cancelled ctx succeeded, want ctx's error")
	}
	if d, err := other.RedeliveryHorizon(ctx); err != nil || d != 5*time.Hour {
		t.Fatalf("RedeliveryHorizon after a cancelled call = %s, %v; want 5h", d, err)
	}
}
