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
	if got := s.RedeliveryHorizon(); got != 72*time.Hour {
		t.Errorf("RedeliveryHorizon = %s, want the longest retention, 72h", got)
	}

	missing, err := New(nil, Config{Brokers: k.Brokers(), Group: "g", Topics: []string{kafkatest.Name("missing")}, KafkaOffsetsOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer missing.Close()
	if got := missing.RedeliveryHorizon(); got != 0 {
		t.Errorf("RedeliveryHorizon of a missing topic = %s, want 0 (unknown)", got)
	}
}
