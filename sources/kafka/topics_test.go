package kafka

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	kafkago "github.com/segmentio/kafka-go"
)

// logBuffer collects a source's log records as text, for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logger returns a logger writing to b (and to stderr when KAFKA_TEST_LOG
// is set).
func (b *logBuffer) logger() *slog.Logger {
	h := slog.Handler(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if l := testLogger(); l != nil {
		return slog.New(teeHandler{h, l.Handler()})
	}
	return slog.New(h)
}

type teeHandler struct{ a, b slog.Handler }

func (t teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return t.a.Enabled(ctx, l) || t.b.Enabled(ctx, l)
}

func (t teeHandler) Handle(ctx context.Context, r slog.Record) error {
	if t.a.Enabled(ctx, r.Level) {
		_ = t.a.Handle(ctx, r.Clone())
	}
	if t.b.Enabled(ctx, r.Level) {
		_ = t.b.Handle(ctx, r.Clone())
	}
	return nil
}

func (t teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return teeHandler{t.a.WithAttrs(as), t.b.WithAttrs(as)}
}

func (t teeHandler) WithGroup(name string) slog.Handler {
	return teeHandler{t.a.WithGroup(name), t.b.WithGroup(name)}
}

// produceTo writes messages from..to-1 to topic, message i to partition
// i%partitions, with idempotency-key "topic-i".
func (e *env) produceTo(topic string, partitions, from, to int) {
	e.t.Helper()
	var msgs []kafkago.Message
	for i := from; i < to; i++ {
		v := strconv.Itoa(i)
		msgs = append(msgs, kafkago.Message{
			Partition: i % partitions,
			Value:     []byte(v),
			Headers:   []kafkago.Header{{Key: DefaultIDHeader, Value: []byte(topic + "-" + v)}},
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.kafka.Produce(ctx, topic, msgs...); err != nil {
		e.t.Fatal(err)
	}
}

// effectsOf returns the number of distinct messages with an effect whose
// lane is of topic.
func (e *env) effectsOf(topic string) int {
	e.t.Helper()
	var n int
	err := e.pool.QueryRow(context.Background(),
		`SELECT count(DISTINCT (lane, off)) FROM effects WHERE lane LIKE $1 || '/%'`, topic).Scan(&n)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

func quickMetadata(c *Config) { c.MetadataInterval = 200 * time.Millisecond }

// A topic listed in Topics that does not exist yet does not keep the group
// from consuming the others: it is logged as a warning naming it, and
// consumed once it is created.
func TestMissingTopicDoesNotStopOthers(t *testing.T) {
	e := newEnv(t, 2)
	later := kafkatest.Name("later")
	var logs logBuffer
	s := e.source(quickMetadata, func(c *Config) {
		c.Topics = []string{e.topic, later}
		c.Logger = logs.logger()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := startWorkers(ctx, s, e.pool, 2, 50, nil)
	e.produce(0, 40)
	e.waitEffects(40, time.Minute)
	waitFor(t, time.Minute, "a warning naming the missing topic", func() bool {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, later) {
				return true
			}
		}
		return false
	})

	if err := e.kafka.CreateTopic(ctx, later, 2); err != nil {
		t.Fatal(err)
	}
	e.produceTo(later, 2, 0, 20)
	waitFor(t, time.Minute, "the effects of the topic created later", func() bool { return e.effectsOf(later) >= 20 })
	want := []string{e.topic + "/0", e.topic + "/1", later + "/0", later + "/1"}
	slices.Sort(want)
	waitFor(t, time.Minute, "the assignment of both topics", func() bool { return slices.Equal(s.Assignment(), want) })
	cancel()
	w.wait(t)
	if rows, distinct := e.effects(); rows != 60 || distinct != 60 {
		t.Fatalf("%d effect rows for %d distinct messages, want 60 of each", rows, distinct)
	}
}

// A group whose only topic is created after the consumer started consumes
// it once it exists.
func TestTopicCreatedLater(t *testing.T) {
	e := newEnv(t, 1)
	later := kafkatest.Name("later")
	s := e.source(quickMetadata, func(c *Config) { c.Topics = []string{later} })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := startWorkers(ctx, s, e.pool, 1, 50, nil)
	// The group has joined (with nothing to consume) before the topic exists.
	waitFor(t, time.Minute, "the first generation", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.gs.generations > 0
	})
	if err := e.kafka.CreateTopic(ctx, later, 3); err != nil {
		t.Fatal(err)
	}
	e.produceTo(later, 3, 0, 30)
	waitFor(t, time.Minute, "the effects of the topic created later", func() bool { return e.effectsOf(later) >= 30 })
	cancel()
	w.wait(t)
	if rows, distinct := e.effects(); rows != 30 || distinct != 30 {
		t.Fatalf("%d effect rows for %d distinct messages, want 30 of each", rows, distinct)
	}
}

// Partitions added to a topic while the group consumes it are consumed
// without a restart, by whichever member is assigned them.
func TestPartitionsAdded(t *testing.T) {
	e := newEnv(t, 2)
	a, b := e.source(quickMetadata), e.source(quickMetadata)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	wa := startWorkers(ctx, a, e.pool, 1, 50, nil)
	wb := startWorkers(ctx, b, e.pool, 1, 50, nil)
	e.produce(0, 20)
	e.waitEffects(20, time.Minute)
	// Both members own a partition: the group is stable before the change.
	waitFor(t, time.Minute, "one partition for each member", func() bool {
		return len(a.Assignment()) == 1 && len(b.Assignment()) == 1
	})

	client := &kafkago.Client{Addr: kafkago.TCP(e.kafka.Brokers()...), Timeout: 30 * time.Second}
	resp, err := client.CreatePartitions(ctx, &kafkago.CreatePartitionsRequest{
		Topics: []kafkago.TopicPartitionsConfig{{Name: e.topic, Count: 4}},
	})
	if err == nil && len(resp.Errors) > 0 {
		err = resp.Errors[e.topic]
	}
	if err != nil {
		t.Fatalf("adding partitions: %v", err)
	}
	e.partitions = 4
	e.produce(20, 60)
	e.waitEffects(60, time.Minute)
	waitFor(t, time.Minute, "all four partitions assigned", func() bool {
		got := append(a.Assignment(), b.Assignment()...)
		slices.Sort(got)
		return slices.Equal(got, []string{e.topic + "/0", e.topic + "/1", e.topic + "/2", e.topic + "/3"})
	})
	cancel()
	wa.wait(t)
	wb.wait(t)
	if rows, distinct := e.effects(); rows != 60 || distinct != 60 {
		t.Fatalf("%d effect rows for %d distinct messages, want 60 of each", rows, distinct)
	}
}
