package sinktest

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// setup returns a pool on a fresh database with the outbox migrated.
func setup(t *testing.T) (*pgxpool.Pool, *outbox.Outbox) {
	t.Helper()
	pool := pgtest.NewPool(t)
	o, err := outbox.New(outbox.Config{Mode: outbox.TableMode}) // the suite runs the table-polling relay
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Migrate(context.Background(), pool, "", o.Line()); err != nil {
		t.Fatal(err)
	}
	return pool, o
}

// emit emits msgs in a transaction of its own and commits it.
func emit(t *testing.T, db *pgxpool.Pool, o *outbox.Outbox, msgs ...outbox.Message) {
	t.Helper()
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return o.Emit(ctx, tx, msgs...) }); err != nil {
		t.Fatal(err)
	}
}

// startRelay runs a relay with cfg (short lease, poll and backoff where
// left zero) until the test ends.
func startRelay(t *testing.T, db *pgxpool.Pool, cfg outbox.RelayConfig) {
	t.Helper()
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 2 * time.Second
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 200 * time.Millisecond
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = 10 * time.Millisecond
		cfg.MaxBackoff = 50 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = consumertest.Logger()
	}
	r, err := outbox.NewRelay(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// waitRows polls the database until query returns want, a guard against a
// hung test rather than a timing assertion.
func waitRows(t *testing.T, db *pgxpool.Pool, timeout time.Duration, want int, query string, args ...any) {
	t.Helper()
	waitCount(t, db, timeout, func(n int) bool { return n == want }, "", want, query, args...)
}

// waitAtLeast polls until query returns at least want.
func waitAtLeast(t *testing.T, db *pgxpool.Pool, timeout time.Duration, want int, query string, args ...any) {
	t.Helper()
	waitCount(t, db, timeout, func(n int) bool { return n >= want }, "at least ", want, query, args...)
}

func waitCount(t *testing.T, db *pgxpool.Pool, timeout time.Duration, ok func(int) bool, what string, want int, query string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var n int
		if err := db.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if ok(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s gave %d, want %s%d", query, n, what, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Record is a record as a foreign client (franz-go's kgo) read it.
type Record struct {
	Partition int32
	Offset    int64
	Key       string
	Value     []byte
	Headers   []kgo.RecordHeader
	ID        string // the outbox.IDHeader header
}

// ReadForeign reads topic from the start with franz-go (read-committed),
// until every ID in want has been seen, and returns what it read, per
// partition in offset order. It fails t after timeout, naming what is
// missing.
func ReadForeign(t *testing.T, k *kafkatest.Cluster, topic string, want map[string]bool, timeout time.Duration) []Record {
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
	var out []Record
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
				if h.Key == outbox.IDHeader {
					id = string(h.Value)
				}
			}
			seen[id] = true
			out = append(out, Record{Partition: r.Partition, Offset: r.Offset, Key: string(r.Key), Value: r.Value, Headers: r.Headers, ID: id})
		})
	}
	return out
}

// CreateTopic creates topic with partitions and the given topic configs,
// through kafka-go's admin client (so it works on a real cluster too).
func CreateTopic(t *testing.T, k *kafkatest.Cluster, topic string, partitions int, configs map[string]string) {
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

// ProducesTo returns a kfake request predicate that is true for a produce
// request to topic of fake, which a request names by its name (kafka-go)
// or by its ID (franz-go, produce v13 and later).
func ProducesTo(fake *kfake.Cluster, topic string) func(kmsg.Request) bool {
	id := fake.TopicInfo(topic).TopicID
	return func(req kmsg.Request) bool {
		p, ok := req.(*kmsg.ProduceRequest)
		if !ok {
			return false
		}
		for _, tp := range p.Topics {
			if tp.Topic == topic || tp.TopicID == id {
				return true
			}
		}
		return false
	}
}
