package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/sourcetest"
	"github.com/effectively-once/effectively/internal/kafkatest"
	kafkago "github.com/segmentio/kafka-go"
)

// TestSourceConformance runs the source conformance suite against kfake,
// with offsets in Postgres. A lost lane is a rebalance: another member
// joins the group for another topic, so the source's partitions are
// revoked and assigned to it again in the next generation.
func TestSourceConformance(t *testing.T) {
	const lanes = 3
	sourcetest.Run(t, sourcetest.Harness{
		Lanes: lanes,
		New: func(t *testing.T) *sourcetest.Broker {
			e := newEnv(t, lanes)
			return &sourcetest.Broker{
				Publish: func(t *testing.T, lane int, msgs ...sourcetest.Message) {
					recs := make([]kafkago.Message, len(msgs))
					for i, m := range msgs {
						recs[i] = kafkago.Message{Partition: lane, Value: m.Value}
						for _, h := range m.Headers {
							recs[i].Headers = append(recs[i].Headers, kafkago.Header{Key: h.Key, Value: h.Value})
						}
					}
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
					defer cancel()
					if err := e.kafka.Produce(ctx, e.topic, recs...); err != nil {
						t.Fatal(err)
					}
				},
				Open:      func(*testing.T) consumer.Source { return e.source() },
				DB:        e.pool,
				LoseLanes: func(t *testing.T, src consumer.Source) { e.rebalance(src.(*Source)) },
			}
		},
		// The source tells a null value (a tombstone) from an empty one.
		Features: sourcetest.Features{BinaryValues: true, NilValues: true},
	})
}

// rebalance makes another member join s's group, subscribed to another
// topic, and returns once s's partitions were revoked and assigned to s
// again in a new generation. The member stays in the group until the test
// ends, so that no further rebalance follows.
func (e *env) rebalance(s *Source) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	other := kafkatest.Name("other")
	if err := e.kafka.CreateTopic(ctx, other, 1); err != nil {
		e.t.Fatal(err)
	}
	old := map[*generation]bool{}
	s.mu.Lock()
	for _, l := range s.lanes {
		old[l.gen] = true
	}
	s.mu.Unlock()

	cfg := e.config()
	g, err := kafkago.NewConsumerGroup(kafkago.ConsumerGroupConfig{
		ID: e.group, Brokers: cfg.Brokers, Topics: []string{other},
		HeartbeatInterval: cfg.HeartbeatInterval, SessionTimeout: cfg.SessionTimeout,
		RebalanceTimeout: cfg.RebalanceTimeout, JoinGroupBackoff: cfg.JoinGroupBackoff,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = g.Close() })
	if _, err := g.Next(ctx); err != nil {
		e.t.Fatalf("the other member did not join: %v", err)
	}
	waitFor(e.t, 30*time.Second, "the partitions to come back in a new generation", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		active := 0
		for _, l := range s.lanes {
			if old[l.gen] {
				return false
			}
			if l.state == laneActive {
				active++
			}
		}
		return active == e.partitions
	})
}
