package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"
)

// Tests that run the source under the consumer engine with the idset strategy.

// insertEffects is a BatchHandler writing one effect row per message.
func insertEffects(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
	ids := make([]string, len(msgs))
	lanes := make([]string, len(msgs))
	offs := make([]int64, len(msgs))
	for i, m := range msgs {
		ids[i], lanes[i] = m.DedupeKey.ID, m.Lane
		_, _, offs[i], _ = Position(m)
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, lane, off) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`, ids, lanes, offs)
	return err
}

// engine makes a migrated consumer over src with the idset strategy.
func (e *env) engine(src consumer.Source, hooks *consumertest.Counter, mutate ...func(*consumer.Config)) *consumer.Consumer {
	e.t.Helper()
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := consumer.Config{
		Name:            "ledger",
		Strategy:        strategy,
		BatchHandler:    insertEffects,
		BatchSize:       500,
		RetryBackoff:    20 * time.Millisecond,
		MaxRetryBackoff: 50 * time.Millisecond,
		Hooks:           []consumer.Hook{hooks},
		Logger:          testLogger(),
	}
	for _, m := range mutate {
		m(&cfg)
	}
	return consumertest.NewConsumer(e.t, e.pool, src, cfg)
}

// TestEngineResume: a consumer is stopped mid-stream and another of the same
// group takes over; every message is applied exactly once.
func TestEngineResume(t *testing.T) {
	e := newEnv(t, 3)
	e.resume(6000)
}

// resume produces n messages in two halves, the second while a consumer
// takes the group over from the first, and checks that every message was
// applied exactly once. It returns the consumers' counts.
func (e *env) resume(n int) *consumertest.Counter {
	t := e.t
	t.Helper()
	e.produce(0, n/2)
	h := &consumertest.Counter{}
	firstSrc := e.source()
	first := consumertest.Start(e.engine(firstSrc, h))
	e.waitEffects(n/4, 30*time.Second)
	e.produce(n/2, n)
	second := consumertest.Start(e.engine(e.source(), h))
	first.Stop(t)
	_ = firstSrc.Close() // leaves the group: the second consumer gets every partition
	e.waitEffects(n, 30*time.Second)
	second.Stop(t)
	if rows, distinct := e.effects(); rows != n || distinct != n {
		t.Fatalf("%d effect rows for %d distinct messages, want %d of each; %s", rows, distinct, n, h)
	}
	return h
}

// TestEngineProducerDuplicates: a producer sent some events twice (same
// idempotency-key and payload, different offsets); the idset strategy
// applies each event once.
func TestEngineProducerDuplicates(t *testing.T) {
	const events, dups = 1000, 150
	e := newEnv(t, 2)
	var msgs []kafkago.Message
	for i := range events {
		m := kafkago.Message{
			Partition: i % 2, Value: []byte(fmt.Sprintf(`{"n":%d}`, i)),
			Headers: []kafkago.Header{{Key: DefaultIDHeader, Value: []byte(fmt.Sprintf("evt-%d", i))}},
		}
		msgs = append(msgs, m)
	}
	msgs = append(msgs, msgs[:dups]...) // the producer's retried sends land later in the log
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := e.kafka.Produce(ctx, e.topic, msgs...); err != nil {
		t.Fatal(err)
	}
	h := &consumertest.Counter{}
	r := consumertest.Start(e.engine(e.source(), h))
	waitFor(t, 30*time.Second, "every delivery settled", func() bool {
		tot := h.Total()
		return tot.Applied+tot.Duplicate >= events+dups
	})
	r.Stop(t)
	var rows, distinct int
	if err := e.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT msg_id) FROM effects`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != events || distinct != events || h.Total().Duplicate != dups {
		t.Fatalf("%d effect rows for %d distinct events, want %d; %s", rows, distinct, events, h)
	}
}

// TestEngineBadInput: a message without the ID header (its offset is its
// key), one whose ID header is over the key limit, one whose payload does
// not decode, and one the handler always fails: the first is applied, the
// others parked, and the partition keeps moving past them.
func TestEngineBadInput(t *testing.T) {
	e := newEnv(t, 1)
	ok := func(i int) kafkago.Message {
		return kafkago.Message{Value: []byte(fmt.Sprintf(`{"amount":%d}`, i)),
			Headers: []kafkago.Header{{Key: DefaultIDHeader, Value: []byte(fmt.Sprintf("evt-%d", i))}}}
	}
	msgs := []kafkago.Message{
		ok(0),
		{Value: []byte(`{"amount":1}`)}, // no header: key "topic/0/1"
		{Value: []byte(`{"amount":2}`), Headers: []kafkago.Header{{Key: DefaultIDHeader, Value: []byte(strings.Repeat("k", 600))}}},
		{Value: []byte(`not json`), Headers: []kafkago.Header{{Key: DefaultIDHeader, Value: []byte("evt-3")}}},
		{Value: []byte(`{"amount":-1}`), Headers: []kafkago.Header{{Key: DefaultIDHeader, Value: []byte("evt-4")}}},
		ok(5), ok(6), ok(7),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := e.kafka.Produce(ctx, e.topic, msgs...); err != nil {
		t.Fatal(err)
	}
	type transfer struct {
		Amount int `json:"amount"`
	}
	h := &consumertest.Counter{}
	var fails atomic.Int32
	c := e.engine(e.source(), h, func(cfg *consumer.Config) {
		cfg.BatchHandler = nil
		cfg.MaxAttempts = 3
		cfg.Handler = consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, v transfer) error {
			if v.Amount < 0 {
				fails.Add(1)
				return errors.New("negative amount")
			}
			return insertEffects(ctx, tx, []*consumer.Message{m})
		})
	})
	r := consumertest.Start(c)
	waitFor(t, 30*time.Second, "the partition to pass the bad messages", func() bool {
		return e.storedOffsets()[0][0] == int64(len(msgs))
	})
	r.Stop(t)

	rows, err := e.pool.Query(ctx, `SELECT msg_id FROM effects ORDER BY off`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"evt-0", e.topic + "/0/1", "evt-5", "evt-6", "evt-7"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("applied %v, want %v", got, want)
	}
	prows := consumertest.Parked(t, e.pool, "", "")
	slices.SortFunc(prows, func(a, b consumertest.ParkedRow) int { return strings.Compare(a.Ref, b.Ref) })
	var gotParked []string
	for _, p := range prows {
		gotParked = append(gotParked, p.Ref+" "+p.Reason)
	}
	wantParked := []string{
		e.topic + "/0@2 " + parked.ReasonInvalidKey,
		e.topic + "/0@3 " + parked.ReasonPermanent,
		e.topic + "/0@4 " + parked.ReasonMaxAttempts,
	}
	if fmt.Sprint(gotParked) != fmt.Sprint(wantParked) {
		t.Errorf("parked %v, want %v", gotParked, wantParked)
	}
	if fails.Load() != 3 {
		t.Errorf("the failing message was tried %d times, want 3", fails.Load())
	}
}

// lostAcks passes everything to its Source but, once armed, drops Settle
// calls: the process dies after the transaction committed and before
// anything reached Kafka.
type lostAcks struct {
	*Source
	armed atomic.Bool
}

func (l *lostAcks) Settle(ctx context.Context, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	if l.armed.Load() {
		return nil
	}
	return l.Source.Settle(ctx, b, ack, retry)
}

// TestEngineCrashBeforeKafkaCommit: the consumer dies after its
// transactions committed and before their offsets reached Kafka. With
// offsets in Postgres the next consumer starts after them (nothing is
// delivered again); with KafkaOffsetsOnly they are delivered again and the
// strategy recognises them as duplicates. Either way: no second effect.
func TestEngineCrashBeforeKafkaCommit(t *testing.T) {
	for _, kafkaOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("KafkaOffsetsOnly=%v", kafkaOnly), func(t *testing.T) {
			const n = 2000
			e := newEnv(t, 2)
			opt := func(c *Config) { c.KafkaOffsetsOnly = kafkaOnly }
			e.produce(0, n/2)
			h := &consumertest.Counter{}
			src := &lostAcks{Source: e.source(opt)}
			r := consumertest.Start(e.engine(src, h))
			e.waitEffects(n/2, 30*time.Second)
			src.armed.Store(true) // from now on every ack is lost
			e.produce(n/2, n)
			e.waitEffects(n/2+1, 30*time.Second) // a batch committed whose ack was lost
			r.Stop(t)
			_ = src.Close()

			h2 := &consumertest.Counter{}
			r = consumertest.Start(e.engine(e.source(opt), h2))
			e.waitEffects(n, 30*time.Second)
			waitFor(t, 30*time.Second, "Kafka commits at the end of the log", func() bool {
				offs, err := e.kafka.CommittedOffsets(context.Background(), e.group, e.topic)
				if err != nil {
					t.Fatal(err)
				}
				return offs[0] == n/2 && offs[1] == n/2
			})
			r.Stop(t)
			if rows, distinct := e.effects(); rows != n || distinct != n {
				t.Fatalf("%d effect rows for %d distinct messages, want %d of each; first %s; second %s", rows, distinct, n, h, h2)
			}
			if kafkaOnly && h2.Total().Duplicate == 0 {
				t.Errorf("no redelivery after the lost Kafka commit: %s", h2)
			}
			if !kafkaOnly && h2.Total().Duplicate != 0 {
				t.Errorf("offsets in Postgres, yet %d messages were delivered again", h2.Total().Duplicate)
			}
			t.Logf("first: %s; second: %s", h, h2)
		})
	}
}
