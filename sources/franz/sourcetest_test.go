package franz

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/sourcetest"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestSourceConformance runs the source conformance suite against kfake,
// with offsets in Postgres, and the same features as sources/kafka. A lost
// lane is a rebalance: another member joins the group for another topic,
// so the source's partitions are revoked and assigned to it again in the
// next generation (the group uses an eager balancer here; under the
// default cooperative-sticky balancer a member joining for another topic
// takes nothing away).
func TestSourceConformance(t *testing.T) {
	const lanes = 3
	sourcetest.Run(t, sourcetest.Harness{
		Lanes: lanes,
		New: func(t *testing.T) *sourcetest.Broker {
			e := newEnv(t, lanes)
			return &sourcetest.Broker{
				Publish: func(t *testing.T, lane int, msgs ...sourcetest.Message) {
					recs := make([]*kgo.Record, len(msgs))
					for i, m := range msgs {
						recs[i] = &kgo.Record{Partition: int32(lane), Value: m.Value}
						for _, h := range m.Headers {
							recs[i].Headers = append(recs[i].Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
						}
					}
					e.produceRecords(recs...)
				},
				Open: func(*testing.T) consumer.Source {
					return e.source(func(c *Config) { c.Opts = append(c.Opts, kgo.Balancers(kgo.RoundRobinBalancer())) })
				},
				DB:        e.pool,
				LoseLanes: func(t *testing.T, src consumer.Source) { e.rebalance(src.(*Source)) },
			}
		},
		// The source tells a null value (a tombstone) from an empty one.
		Features: sourcetest.Features{BinaryValues: true, NilValues: true},
	})
}

// rebalance makes another member join s's group, subscribed to another
// topic, and returns once s's partitions were revoked and claimed by s
// again. The member stays in the group until the test ends, so that no
// further rebalance follows.
func (e *env) rebalance(s *Source) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	other := kafkatest.Name("other")
	if err := e.kafka.CreateTopic(ctx, other, 1); err != nil {
		e.t.Fatal(err)
	}
	old := map[*lane]bool{}
	s.mu.Lock()
	for _, l := range s.lanes {
		old[l] = true
	}
	s.mu.Unlock()
	joined := make(chan struct{}, 1)
	opts := append(groupOpts(), kgo.SeedBrokers(e.kafka.Brokers()...), kgo.ConsumerGroup(e.group), kgo.ConsumeTopics(other),
		kgo.Balancers(kgo.RoundRobinBalancer()), kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) {
			select {
			case joined <- struct{}{}:
			default:
			}
		}))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cl.Close)
	go func() {
		for ctx.Err() == nil {
			if cl.PollFetches(ctx).IsClientClosed() {
				return
			}
		}
	}()
	select {
	case <-joined:
	case <-ctx.Done():
		e.t.Fatal("the other member did not join")
	}
	waitFor(e.t, 30*time.Second, "the partitions to come back", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		active := 0
		for _, l := range s.lanes {
			if old[l] {
				return false
			}
			if l.state == laneActive {
				active++
			}
		}
		return active == e.partitions
	})
}
