package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// foreignRecord is a record as a foreign client (franz-go's kgo) read it.
type foreignRecord struct {
	partition int32
	offset    int64
	key       string
	id        string
}

// readForeign reads topic from the start with franz-go (read-committed),
// until every ID in want has been seen, and returns what it read, per
// partition in offset order. It fails t after timeout, naming what is
// missing.
func readForeign(t *testing.T, k *kafkatest.Cluster, topic string, want map[string]bool, timeout time.Duration) []foreignRecord {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []foreignRecord
	seen := map[string]bool{}
	missing := func() []string {
		var m []string
		for id := range want {
			if !seen[id] {
				m = append(m, id)
			}
		}
		return m
	}
	for len(missing()) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			m := missing()
			t.Fatalf("a foreign reader did not find %d published messages in %s (e.g. %v) after %v", len(m), topic, m[:min(len(m), 5)], timeout)
		}
		for _, e := range fs.Errors() {
			t.Logf("foreign reader: partition %d: %v", e.Partition, e.Err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			var id string
			for _, h := range r.Headers {
				if h.Key == IDHeader {
					id = string(h.Value)
				}
			}
			seen[id] = true
			out = append(out, foreignRecord{partition: r.Partition, offset: r.Offset, key: string(r.Key), id: id})
		})
	}
	return out
}

// createTopic creates topic with partitions and the given topic configs,
// through kafka-go's admin client (so it works on a real cluster too).
func createTopic(t *testing.T, k *kafkatest.Cluster, topic string, partitions int, configs map[string]string) {
	t.Helper()
	tc := kafkago.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}
	for n, v := range configs {
		tc.ConfigEntries = append(tc.ConfigEntries, kafkago.ConfigEntry{ConfigName: n, ConfigValue: v})
	}
	c := &kafkago.Client{Addr: kafkago.TCP(k.Brokers()...), Timeout: 30 * time.Second}
	resp, err := c.CreateTopics(context.Background(), &kafkago.CreateTopicsRequest{Topics: []kafkago.TopicConfig{tc}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
}

// publishedIDs returns the IDs of the rows marked published.
func publishedIDs(t *testing.T, db *pgxpool.Pool) map[string]bool {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT msg_id FROM effectively.outbox WHERE published_at IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}
