package kafka

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/pg"
	kafkago "github.com/segmentio/kafka-go"
)

func TestConfigErrors(t *testing.T) {
	ok := Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"}}
	cases := []struct {
		field  string
		mutate func(*Config)
	}{
		{"Brokers", func(c *Config) { c.Brokers = nil }},
		{"Brokers", func(c *Config) { c.Brokers = []string{" "} }},
		{"Group", func(c *Config) { c.Group = "" }},
		{"Topics", func(c *Config) { c.Topics = nil }},
		{"Topics", func(c *Config) { c.Topics = []string{"a", "a"} }},
		{"Topics", func(c *Config) { c.Topics = []string{"a b"} }},
		{"StartOffset", func(c *Config) { c.StartOffset = 42 }},
		{"MinBytes", func(c *Config) { c.MinBytes = 10; c.MaxBytes = 5 }},
		{"MaxWait", func(c *Config) { c.MaxWait = -time.Second }},
		{"HeartbeatInterval", func(c *Config) { c.SessionTimeout = time.Second; c.HeartbeatInterval = 2 * time.Second }},
		{"RevokeTimeout", func(c *Config) { c.RebalanceTimeout = time.Second; c.RevokeTimeout = 2 * time.Second }},
		{"PartitionBuffer", func(c *Config) { c.PartitionBuffer = -1 }},
		{"ReadUncommitted", func(c *Config) { c.ReadCommitted = true; c.ReadUncommitted = true }},
		{"OffsetsTable", func(c *Config) { c.OffsetsTable = strings.Repeat("x", 64) }},
		{"OffsetsTable", func(c *Config) { c.OffsetsTable = "bad\xff" }},
		{"Schema", func(c *Config) { c.Schema = "a\x00b" }},
	}
	for _, tc := range cases {
		cfg := ok
		tc.mutate(&cfg)
		_, err := New(nil, cfg)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || ce.Package != "kafka" {
			t.Errorf("%s: got %v, want a ConfigError for %s", tc.field, err, tc.field)
			continue
		}
		if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, consumer.ErrInvalidConfig) {
			t.Errorf("%s: %v does not match ErrInvalidConfig", tc.field, err)
		}
	}
	if _, err := New(nil, ok); err == nil || !strings.Contains(err.Error(), "database") {
		t.Errorf("nil db with offsets in Postgres: got %v", err)
	}
	only := ok
	only.KafkaOffsetsOnly = true
	if _, err := New(nil, only); err != nil {
		t.Errorf("KafkaOffsetsOnly without db: %v", err)
	}
}

func TestMigrationSQLQuotesIdentifiers(t *testing.T) {
	s, err := New(noDB{}, Config{Brokers: []string{"b:1"}, Group: "g", Topics: []string{"t"}, Schema: `od"d`, OffsetsTable: "Off Sets"})
	if err != nil {
		t.Fatal(err)
	}
	sql, err := pg.MigrationSQL(`od"d`, s.Migrations()...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sql, `"od""d"."Off Sets"`) {
		t.Errorf("identifiers not quoted:\n%s", sql)
	}
}

type noDB struct{ pg.DB }

func TestMessageFields(t *testing.T) {
	e := newEnv(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	err := e.kafka.Produce(ctx, e.topic,
		kafkago.Message{Partition: 1, Key: []byte("acct-1"), Value: []byte("a"), Headers: []kafkago.Header{{Key: "idempotency-key", Value: []byte("evt-1")}, {Key: "trace", Value: []byte("x")}}},
		kafkago.Message{Partition: 1, Value: []byte("b")},
		kafkago.Message{Partition: 1, Value: []byte("c"), Headers: []kafkago.Header{{Key: "idempotency-key", Value: nil}}},
	)
	if err != nil {
		t.Fatal(err)
	}
	s := e.source()
	lane := e.topic + "/1"
	var msgs []*consumer.Message
	for len(msgs) < 3 { // Fetch returns what has arrived so far
		b, err := s.Fetch(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if b.Lane != lane {
			t.Fatalf("batch of lane %s, want %s", b.Lane, lane)
		}
		msgs = append(msgs, b.Messages...)
		if err := process(ctx, s, e.pool, b, nil); err != nil {
			t.Fatal(err)
		}
	}
	if len(msgs) != 3 {
		t.Fatalf("%d messages, want 3", len(msgs))
	}
	b := &consumer.Batch{Messages: msgs}
	m := b.Messages[0]
	if m.ID != "evt-1" || string(m.Key) != "acct-1" || string(m.Value) != "a" || m.Lane != lane ||
		m.Ref != lane+"@0" || m.Source != "kafka" || m.Attempt != 1 || m.Time.IsZero() {
		t.Errorf("first message: %+v", m)
	}
	if v, ok := m.Header("trace"); !ok || string(v) != "x" || len(m.Headers) != 2 {
		t.Errorf("headers: %+v", m.Headers)
	}
	if got := b.Messages[1].ID; got != lane+"/1" {
		t.Errorf("message without header: ID %q, want %q", got, lane+"/1")
	}
	if got := b.Messages[2].ID; got != lane+"/2" {
		t.Errorf("message with empty header: ID %q, want %q", got, lane+"/2")
	}
	if topic, p, off, ok := Position(b.Messages[2]); !ok || topic != e.topic || p != 1 || off != 2 {
		t.Errorf("Position: %s %d %d %v", topic, p, off, ok)
	}
	if got := e.storedOffsets()[1][0]; got != 3 {
		t.Errorf("stored next offset %d, want 3", got)
	}
}

func TestSequenceKey(t *testing.T) {
	kf := SequenceKey("sender", "seq")
	m := &consumer.Message{ID: "x", Headers: []consumer.Header{{Key: "sender", Value: []byte("svc")}, {Key: "seq", Value: []byte("42")}}}
	k, err := kf(m)
	if err != nil || k.Sender != "svc" || k.Seq != 42 {
		t.Errorf("got %+v %v", k, err)
	}
	for _, hs := range [][]consumer.Header{
		{{Key: "seq", Value: []byte("1")}},
		{{Key: "sender", Value: []byte("svc")}},
		{{Key: "sender", Value: []byte("svc")}, {Key: "seq", Value: []byte("zero")}},
		{{Key: "sender", Value: []byte("svc")}, {Key: "seq", Value: []byte("0")}},
	} {
		if _, err := kf(&consumer.Message{Headers: hs}); err == nil {
			t.Errorf("headers %v: no error", hs)
		}
	}
}

// TestAllOnce: one source, several workers, many partitions: every message
// has exactly one effect; Postgres and Kafka end at the log end.
func TestAllOnce(t *testing.T) {
	const n = 5000
	e := newEnv(t, 4)
	e.produce(0, n)
	s := e.source()
	ctx, cancel := context.WithCancel(context.Background())
	w := startWorkers(ctx, s, e.pool, 3, 200, nil)
	e.waitEffects(n, 30*time.Second)
	cancel()
	w.wait(t)
	if rows, distinct := e.effects(); rows != n || distinct != n {
		t.Fatalf("%d effect rows for %d distinct messages, want %d of each", rows, distinct, n)
	}
	for p, row := range e.storedOffsets() {
		if row[0] != n/4 {
			t.Errorf("partition %d: stored next offset %d, want %d", p, row[0], n/4)
		}
	}
	waitFor(t, 10*time.Second, "Kafka commits", func() bool {
		offs, err := e.kafka.CommittedOffsets(context.Background(), e.group, e.topic)
		if err != nil {
			t.Fatal(err)
		}
		for p := range 4 {
			if offs[p] != n/4 {
				return false
			}
		}
		return true
	})
}

// TestResume: a consumer stops mid-stream, another of the same group takes
// over: every message is applied exactly once.
func TestResume(t *testing.T) {
	const n = 4000
	e := newEnv(t, 3)
	e.produce(0, n/2)
	a := e.source()
	ctx, cancel := context.WithCancel(context.Background())
	w := startWorkers(ctx, a, e.pool, 2, 100, nil)
	e.waitEffects(n/4, 30*time.Second)
	cancel()
	w.wait(t)
	_ = a.Close()
	if _, d := e.effects(); d >= n {
		t.Fatalf("first consumer already did everything (%d)", d)
	}

	e.produce(n/2, n)
	b := e.source()
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	w = startWorkers(ctx, b, e.pool, 2, 100, nil)
	e.waitEffects(n, 30*time.Second)
	cancel()
	w.wait(t)
	if rows, distinct := e.effects(); rows != n || distinct != n {
		t.Fatalf("%d effect rows for %d distinct messages, want %d of each", rows, distinct, n)
	}
}

// TestRetryRedelivery: a message handed back is delivered again after its
// delay with Attempt 2, later messages go on meanwhile, and the stored and
// Kafka-committed offsets stay at the retried message until it commits.
func TestRetryRedelivery(t *testing.T) {
	e := newEnv(t, 1)
	e.produce(0, 10)
	s := e.source()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	seen := 0
	for seen < 10 {
		b, err := s.Fetch(ctx, 5)
		if err != nil {
			t.Fatal(err)
		}
		var ack []*consumer.Message
		var retry []consumer.Retry
		for _, m := range b.Messages {
			if m.Attempt != 1 {
				t.Fatalf("%s delivered again too early (attempt %d)", m.Ref, m.Attempt)
			}
			seen++
			if _, _, off, _ := Position(m); off == 2 { // hand back offset 2
				retry = append(retry, consumer.Retry{Message: m, Delay: 2 * time.Second})
			} else {
				ack = append(ack, m)
			}
		}
		commit(t, ctx, s, e, b, ack, retry)
	}
	if next := e.storedOffsets()[0][0]; next != 2 {
		t.Errorf("stored next offset %d while offset 2 waits for a retry, want 2", next)
	}
	time.Sleep(1200 * time.Millisecond) // a Kafka commit tick
	if offs, _ := e.kafka.CommittedOffsets(ctx, e.group, e.topic); offs[0] > 2 {
		t.Errorf("Kafka committed %d past the retried offset 2", offs[0])
	}
	start := time.Now()
	b, err := s.Fetch(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Messages) != 1 || b.Messages[0].Ref != e.topic+"/0@2" || b.Messages[0].Attempt != 2 {
		t.Fatalf("redelivery: %d messages, first %+v", len(b.Messages), b.Messages[0])
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("redelivery took %s", time.Since(start))
	}
	commit(t, ctx, s, e, b, b.Messages, nil)
	if next := e.storedOffsets()[0][0]; next != 10 {
		t.Errorf("stored next offset %d after the retry committed, want 10", next)
	}
}

func commit(t *testing.T, ctx context.Context, s *Source, e *env, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) {
	t.Helper()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := s.BeforeCommit(ctx, tx, b, ack); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Settle(ctx, b, ack, retry); err != nil {
		t.Fatal(err)
	}
}

// TestOneBatchPerLane: while a partition's batch is in flight, Fetch hands
// out nothing more of it; messages settled in neither list (abandoned, as
// after a rolled-back transaction) come back at once, in order, with
// Attempt 2.
func TestOneBatchPerLane(t *testing.T) {
	e := newEnv(t, 1)
	e.produce(0, 20)
	s := e.source()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	first, err := s.Fetch(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	b, err := s.Fetch(short, 5)
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Fetch while the only partition is in flight: batch %v, err %v", b, err)
	}
	if err := s.Settle(ctx, first, nil, nil); err != nil {
		t.Fatal(err)
	}
	again, err := s.Fetch(ctx, 50)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Messages) < len(first.Messages) {
		t.Fatalf("redelivery has %d messages, want at least %d", len(again.Messages), len(first.Messages))
	}
	for i, m := range first.Messages {
		// A redelivery is a new delivery of the same record; the first
		// one, which its reader may still look at, is left as it was.
		if r := again.Messages[i]; r.Ref != m.Ref || r.Attempt != 2 || m.Attempt != 1 {
			t.Errorf("message %d of the redelivery: %s attempt %d (first delivery: attempt %d), want %s attempt 2 (1)", i, r.Ref, r.Attempt, m.Attempt, m.Ref)
		}
	}
	commit(t, ctx, s, e, again, again.Messages, nil)
	_, _, last, _ := Position(again.Messages[len(again.Messages)-1])
	if next := e.storedOffsets()[0][0]; next != last+1 {
		t.Errorf("stored next offset %d, want %d", next, last+1)
	}
}

// TestLag: Lag counts the records between each partition's commit point
// and the end of its log, and reaches zero once everything committed.
func TestLag(t *testing.T) {
	const n = 600
	e := newEnv(t, 2)
	e.produce(0, n)
	s := e.source()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b, err := s.Fetch(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	// A partition's position is unknown until its first batch settles (this
	// group is new and starts at the log's start).
	if _, ok := s.Lag()[b.Lane]; ok {
		t.Fatalf("lag reported before the position is known: %v", s.Lag())
	}
	// Settled without a transaction, which is enough to move the commit
	// point: the partition then lags by the records after the batch.
	if err := s.Settle(ctx, b, b.Messages, nil); err != nil {
		t.Fatal(err)
	}
	want := int64(n/2 - len(b.Messages))
	waitFor(t, 10*time.Second, "lag of the settled partition", func() bool {
		return s.Lag()[b.Lane] == want
	})
	w := startWorkers(ctx, s, e.pool, 2, 100, nil)
	e.waitEffects(n-len(b.Messages), 30*time.Second) // the first batch was acked without effects
	waitFor(t, 10*time.Second, "no lag", func() bool {
		lag := s.Lag()
		return len(lag) == 2 && lag[b.Lane] == 0 && sum(lag) == 0
	})
	cancel()
	w.wait(t)
}

func sum(m map[string]int64) (total int64) {
	for _, v := range m {
		total += v
	}
	return total
}
