package franzsink_test

import (
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/outbox/franzsink"
	"github.com/effectively-once/effectively/outbox/internal/sinktest"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newSink is the suite's constructor: kgo's defaults (the idempotent
// producer), the record batch bounded as asked, and, hurried, a produce
// request given up on after about 200 ms and retried a millisecond later;
// with a long metadata age, kgo.MetadataMaxAge of an hour.
func newSink(t *testing.T, k *kafkatest.Cluster, topic string, o sinktest.Options) outbox.Sink {
	t.Helper()
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers()...)}
	if o.BatchBytes > 0 {
		opts = append(opts, kgo.ProducerBatchMaxBytes(int32(o.BatchBytes)))
	}
	if o.Hurried {
		opts = append(opts, kgo.ProduceRequestTimeout(100*time.Millisecond), kgo.RequestTimeoutOverhead(100*time.Millisecond),
			kgo.RetryBackoffFn(func(int) time.Duration { return time.Millisecond }), kgo.MetadataMinAge(10*time.Millisecond))
	}
	if o.LongMetadataAge {
		opts = append(opts, kgo.MetadataMaxAge(time.Hour))
	}
	return open(t, topic, opts...)
}

func open(t *testing.T, topic string, opts ...kgo.Opt) *franzsink.Sink {
	t.Helper()
	s, err := franzsink.New(franzsink.Config{Topic: topic, Opts: opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestConformance runs the sink suite every Kafka sink runs.
func TestConformance(t *testing.T) { sinktest.Run(t, newSink) }

// TestClientSettings: for each client setting a user could pass, New
// either refuses it with an error that says what is wrong, or nothing the
// relay marks published is missing from the topic, as a foreign
// read-committed reader sees it, and a message over the topic's
// max.message.bytes is parked with the broker's reason, holding its key's
// later message back.
func TestClientSettings(t *testing.T) {
	k := kafkatest.New(t)
	cases := []struct {
		name    string
		opts    []kgo.Opt
		refused string // what the error must name; "" when the setting is accepted
	}{
		{"no acks", []kgo.Opt{kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.NoAck())}, "NoAck"},
		{"not idempotent, five in flight", []kgo.Opt{kgo.DisableIdempotentWrite(), kgo.MaxProduceRequestsInflightPerBroker(5)}, "MaxProduceRequestsInflightPerBroker"},
		{"idempotent produce cancellation", []kgo.Opt{kgo.AllowIdempotentProduceCancellation()}, "AllowIdempotentProduceCancellation"},
		{"transactional", []kgo.Opt{kgo.TransactionalID("tx")}, "TransactionalID"},
		{"round robin", []kgo.Opt{kgo.RecordPartitioner(kgo.RoundRobinPartitioner())}, "partitioner"},
		{"least backup", []kgo.Opt{kgo.RecordPartitioner(kgo.LeastBackupPartitioner())}, "partitioner"},
		{"sticky", []kgo.Opt{kgo.RecordPartitioner(kgo.StickyPartitioner())}, "partitioner"},
		{"uniform bytes without keys", []kgo.Opt{kgo.RecordPartitioner(kgo.UniformBytesPartitioner(1<<16, true, false, nil))}, "partitioner"},
		{"always another topic", []kgo.Opt{kgo.DefaultProduceTopic("elsewhere"), kgo.DefaultProduceTopicAlways()}, "DefaultProduceTopicAlways"},
		{"defaults (idempotent, all acks)", nil, ""},
		{"not idempotent, one in flight, leader ack", []kgo.Opt{kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())}, ""},
		{"small batches", []kgo.Opt{kgo.ProducerBatchMaxBytes(2500), kgo.MaxBufferedRecords(3)}, ""},
		{"small buffer bytes", []kgo.Opt{kgo.MaxBufferedBytes(5000)}, ""},
		{"one retry", []kgo.Opt{kgo.RecordRetries(1)}, ""},
		{"linger", []kgo.Opt{kgo.ProducerLinger(50 * time.Millisecond)}, ""},
		{"zstd", []kgo.Opt{kgo.ProducerBatchCompression(kgo.ZstdCompression())}, ""},
		{"sticky key", []kgo.Opt{kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil))}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			topic := kafkatest.Name("acks")
			opts := append([]kgo.Opt{kgo.SeedBrokers(k.Brokers()...)}, tc.opts...)
			s, err := franzsink.New(franzsink.Config{Topic: topic, Opts: opts})
			if tc.refused != "" {
				if err == nil {
					s.Close()
					t.Fatalf("New accepted a client with %s", tc.name)
				}
				if !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("the error does not name %s: %v", tc.refused, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			sinktest.CheckNothingLost(t, k, topic, s)
		})
	}
	if _, err := franzsink.New(franzsink.Config{}); err == nil || !strings.Contains(err.Error(), "Topic") {
		t.Fatalf("a Config without a Topic: %v", err)
	}
}
