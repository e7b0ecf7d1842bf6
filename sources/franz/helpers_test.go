package franz

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is one test's Kafka cluster, topic, group and database.
type env struct {
	t          *testing.T
	kafka      *kafkatest.Cluster
	topic      string
	group      string
	partitions int
	pool       *pgxpool.Pool
	producer   *kgo.Client
}

func newEnv(t *testing.T, partitions int) *env {
	t.Helper()
	e := &env{
		t: t, kafka: kafkatest.New(t), topic: kafkatest.Name("orders"), group: kafkatest.Name("ledger"),
		partitions: partitions, pool: pgtest.NewPool(t),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := e.kafka.CreateTopic(ctx, e.topic, partitions); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL, lane text NOT NULL, off bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	p, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers()...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	e.producer = p
	return e
}

// groupOpts are the quick group timings of the tests.
func groupOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.SessionTimeout(kafkatest.SessionTimeout),
		kgo.HeartbeatInterval(kafkatest.HeartbeatInterval),
		kgo.RebalanceTimeout(5 * time.Second),
		kgo.FetchMaxWait(kafkatest.MaxWait),
	}
}

// config returns a Config with quick test settings.
func (e *env) config() Config {
	return Config{
		Brokers:       e.kafka.Brokers(),
		Group:         e.group,
		Topics:        []string{e.topic},
		Opts:          groupOpts(),
		RevokeTimeout: 2 * time.Second,
		Logger:        testLogger(),
	}
}

// testLogger logs to stderr when KAFKA_TEST_LOG is set.
func testLogger() *slog.Logger {
	switch os.Getenv("KAFKA_TEST_LOG") {
	case "":
		return slog.New(slog.DiscardHandler)
	case "debug":
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, nil))
}

// source starts a migrated Source; it is closed at the end of the test.
func (e *env) source(mutate ...func(*Config)) *Source {
	e.t.Helper()
	cfg := e.config()
	for _, m := range mutate {
		m(&cfg)
	}
	s, err := New(e.pool, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := pg.Migrate(context.Background(), e.pool, cfg.Schema, s.Migrations()...); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

// produceRecords writes recs and waits for the broker's acknowledgement.
func (e *env) produceRecords(recs ...*kgo.Record) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, r := range recs {
		if r.Topic == "" {
			r.Topic = e.topic
		}
	}
	if err := e.producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		e.t.Fatal(err)
	}
}

// produce writes messages from..to-1, message i to partition i%partitions
// with value "i" and idempotency-key "k-i".
func (e *env) produce(from, to int) {
	e.t.Helper()
	recs := make([]*kgo.Record, 0, to-from)
	for i := from; i < to; i++ {
		v := strconv.Itoa(i)
		recs = append(recs, &kgo.Record{
			Partition: int32(i % e.partitions),
			Value:     []byte(v),
			Headers:   []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte("k-" + v)}},
		})
	}
	e.produceRecords(recs...)
}

// waitFor polls cond every 10ms until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
