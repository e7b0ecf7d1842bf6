package failover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/standby"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

// The invariant workload through a failover with a Kafka source, whose
// offsets are stored in Postgres in the same transaction as the effects
// and the markers: RunKafka runs it for any Kafka source of the library
// (sources/kafka in kafka_test.go, sources/franz in franz_test.go).

// KafkaSource is a Kafka source as the runs use it.
type KafkaSource interface {
	consumer.Source
	Migrations() []pg.Line
	Close() error
}

// KafkaConfig is what a run asks of its source: the group's timings are the
// quick ones of the tests (a 6s session timeout, 200ms heartbeats, a 5s
// rebalance timeout, a 2s revoke timeout, 100ms fetch waits).
type KafkaConfig struct {
	Pool    *pgxpool.Pool
	Brokers []string
	Group   string
	Topic   string
	Logger  *slog.Logger
}

// NewKafkaSource makes the source of one consumer of a run, as a new
// process of the application would.
type NewKafkaSource func(cfg KafkaConfig) (KafkaSource, error)

// RunKafka runs the invariant workload (messages with idempotency keys,
// every tenth produced twice) through a primary failover with the sources
// newSource makes: synchronous replication, then asynchronous replication
// losing the last commits with the consumer restarted and with it running
// on, and losing every commit of the group. Every message must end with
// exactly one effect.
func RunKafka(t *testing.T, newSource NewKafkaSource) {
	t.Run("SynchronousFailover", func(t *testing.T) { kafkaSynchronousFailover(t, newSource) })
	t.Run("AsynchronousFailoverConsumesTheLostRangeAgain", func(t *testing.T) {
		kafkaAsynchronousFailoverConsumesTheLostRangeAgain(t, newSource)
	})
	t.Run("AsynchronousFailoverRunningConsumer", func(t *testing.T) { kafkaAsynchronousFailoverRunningConsumer(t, newSource) })
	t.Run("AsynchronousFailoverLosesTheFirstCommits", func(t *testing.T) {
		kafkaAsynchronousFailoverLosesTheFirstCommits(t, newSource)
	})
	t.Run("AsynchronousFailoverBehindARetry", func(t *testing.T) { kafkaAsynchronousFailoverBehindARetry(t, newSource) })
}

const partitions = 3

// kafkaRun is a topic holding the workload and the group that consumes it.
type kafkaRun struct {
	t         *testing.T
	p         *pair
	kafka     *kafkatest.Cluster
	topic     string
	group     string
	h         *progress
	g         *gate
	ack       standby.Config // the consumer's Config.StandbyAck
	newSource NewKafkaSource
	// failing, while it holds true, fails the handler of message k-0
	// (partition 0's first) at each attempt.
	failing atomic.Bool
	// wentBack counts the times the source found the offsets table behind
	// what it knew it stored: at a batch's offset write (the batch is
	// fenced) or at its once-a-second comparison of the stored positions
	// with its lanes' (the generation ends, and no batch is fenced). The
	// source reports both only in its log.
	wentBack atomic.Int64
}

// newKafkaRun produces the workload: messages 0..N-1 with idempotency-key
// "k-i", every tenth produced twice (a producer's retry).
func newKafkaRun(t *testing.T, p *pair, newSource NewKafkaSource) *kafkaRun {
	t.Helper()
	k := &kafkaRun{t: t, p: p, kafka: kafkatest.New(t), topic: kafkatest.Name("orders"), group: kafkatest.Name("ledger"),
		h: newProgress(), g: newGate(), newSource: newSource}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.kafka.CreateTopic(ctx, k.topic, partitions); err != nil {
		t.Fatal(err)
	}
	var msgs []kafkago.Message
	for i := range messages {
		m := kafkago.Message{Partition: i % partitions, Value: []byte("v"),
			Headers: []kafkago.Header{{Key: kafka.DefaultIDHeader, Value: []byte("k-" + strconv.Itoa(i))}}}
		msgs = append(msgs, m)
		if i%10 == 0 {
			msgs = append(msgs, m)
		}
	}
	if err := k.kafka.Produce(ctx, k.topic, msgs...); err != nil {
		t.Fatal(err)
	}
	return k
}

// start runs a consumer of the group with a new Source, as a new process
// of the application would.
func (k *kafkaRun) start() (KafkaSource, *consumertest.Running) {
	k.t.Helper()
	log := slog.New(&countRecords{Handler: logger(k.t).Handler(), match: "the offsets table went back", n: &k.wentBack})
	src, err := k.newSource(KafkaConfig{Pool: k.p.pool, Brokers: k.kafka.Brokers(), Group: k.group, Topic: k.topic, Logger: log})
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { _ = src.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := pg.Migrate(ctx, k.p.pool, "", src.Migrations()...); err != nil {
		k.t.Fatal(err)
	}
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		k.t.Fatal(err)
	}
	c := consumertest.NewConsumer(k.t, k.p.pool, src, consumer.Config{
		Name:      "ledger",
		Strategy:  strategy,
		BatchSize: batchSize,
		Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			k.g.pass(ctx)
			if m.DedupeKey.ID == "k-0" && k.failing.Load() {
				return errors.New("k-0 fails while the test says so")
			}
			_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id) VALUES ($1)`, m.DedupeKey.ID)
			return err
		},
		RetryBackoff:    20 * time.Millisecond,
		MaxRetryBackoff: 100 * time.Millisecond,
		MaxAttempts:     100_000, // k-0 fails for as long as a test says
		Hooks:           []consumer.Hook{k.h},
		StandbyAck:      k.ack,
		Logger:          logger(k.t),
	})
	return src, consumertest.Start(c)
}

// restart stops the consumer of src and r, and starts another on a new
// pool, as a restarted process of the application would.
func (k *kafkaRun) restart(src KafkaSource, r *consumertest.Running) *consumertest.Running {
	k.t.Helper()
	r.Stop(k.t)
	_ = src.Close()
	k.p.reconnect()
	_, r = k.start()
	return r
}

// waitAll waits until every message has an effect on the standby, the
// server that accepts writes at the end.
func (k *kafkaRun) waitAll() {
	k.t.Helper()
	timeout := time.After(time.Minute)
	for {
		k.h.mu.Lock()
		changed := k.h.changed
		k.h.mu.Unlock()
		if counts := k.p.effects(k.p.s.standby()); len(counts) >= messages {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			counts := k.p.effects(k.p.s.standby())
			k.t.Fatalf("after a minute %d of %d messages have an effect; missing by partition: %v", len(counts), messages, missingByPartition(counts))
		}
	}
}

// waitStored waits until every partition has an offset stored in Postgres:
// a partition without one resumes from the offset committed to Kafka (see
// docs/failover.md), which an asynchronous failover does not take back.
func (k *kafkaRun) waitStored() {
	k.t.Helper()
	timeout := time.After(time.Minute)
	for {
		k.h.mu.Lock()
		changed := k.h.changed
		k.h.mu.Unlock()
		var n int
		err := k.p.pool.QueryRow(context.Background(), `SELECT count(*) FROM effectively.kafka_offsets
WHERE group_id = $1 AND next_offset IS NOT NULL`, k.group).Scan(&n)
		if err != nil {
			k.t.Fatal(err)
		}
		if n == partitions {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			k.t.Fatalf("after a minute %d of %d partitions have an offset stored", n, partitions)
		}
	}
}

// Synchronous replication with the Kafka source: exactly one effect per
// message, the consumer going on through the switch.
func kafkaSynchronousFailover(t *testing.T, newSource NewKafkaSource) {
	kafkaSynchronous(t, startPair(t, true), newSource, standby.Config{})
}

// kafkaSynchronous is the synchronous failover's run on the synchronous
// pair p, with the consumer's Config.StandbyAck set to ack.
func kafkaSynchronous(t *testing.T, p *pair, newSource NewKafkaSource, ack standby.Config) {
	k := newKafkaRun(t, p, newSource)
	k.ack = ack
	_, r := k.start()
	p.synchronousRun(k.h, k.g, func() {
		k.waitAll()
		r.Stop(t)
	})
}

// Asynchronous replication with the Kafka source: the standby is cut off,
// the consumer commits more batches on the primary alone, and the primary
// dies. The promoted standby lacks those commits, and with them the
// offsets they stored: a consumer that starts on it (a restart, or a new
// member of the group) resumes from those older offsets and consumes the
// lost range again, so every message ends with exactly one effect. Every
// partition has an offset stored before the standby is cut off (see
// waitStored).
func kafkaAsynchronousFailoverConsumesTheLostRangeAgain(t *testing.T, newSource NewKafkaSource) {
	p := startPair(t, false)
	k := newKafkaRun(t, p, newSource)
	src, r := k.start()

	k.h.waitApplied(t, messages/4)
	k.waitStored()
	cut, before := p.cutOff(k.h, k.g)
	promoted := p.killAndPromote(k.g)
	r = k.restart(src, r)
	k.waitAll()
	r.Stop(t)
	final := p.effects(p.s.standby())

	_, unknown, errs := k.h.counts()
	t.Logf("N=%d (%d records): %d effects on the primary at the kill, %d on the standby once promoted (cut off after %d applied): %d lost, %d at the end; %d batches rolled back by the switch, %d messages with an unknown COMMIT outcome",
		messages, messages+messages/10, rows(before), rows(promoted), cut, rows(before)-rows(promoted), rows(final), errs, unknown)
	expectLoss(t, promoted, before)
	expectEach(t, final)
}

// The same failover with the consumer left running: its next offset write
// of a partition finds the promoted standby's table behind what it stored,
// so it drops that batch and rejoins the group, and the claim starts the
// partition again from the stored offset: every message ends with exactly
// one effect. (Before the source checked, it went on from the positions
// it held in memory and the lost range was never applied: 2,682 of 3,000.)
func kafkaAsynchronousFailoverRunningConsumer(t *testing.T, newSource NewKafkaSource) {
	p := startPair(t, false)
	k := newKafkaRun(t, p, newSource)
	_, r := k.start()

	k.h.waitApplied(t, messages/4)
	k.waitStored()
	_, before := p.cutOff(k.h, k.g)
	promoted := p.killAndPromote(k.g)
	expectLoss(t, promoted, before)
	k.waitAll()
	r.Stop(t)
	final := p.effects(p.s.standby())
	expectEach(t, final)
}

// waitKafkaCommitted waits until Kafka holds a committed offset of the
// group for at least one partition: the source commits there only after
// the transaction that stored the offset in Postgres committed.
func (k *kafkaRun) waitKafkaCommitted() map[int]int64 {
	k.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		got, err := k.kafka.CommittedOffsets(ctx, k.group, k.topic)
		cancel()
		if err != nil {
			k.t.Fatal(err)
		}
		for _, off := range got {
			if off > 0 {
				return got
			}
		}
		if time.Now().After(deadline) {
			k.t.Fatalf("after a minute Kafka holds no committed offset of group %s: %v", k.group, got)
		}
		time.Sleep(50 * time.Millisecond) // polling Kafka: no event to wait on
	}
}

// An asynchronous failover that loses every commit of the group: the
// standby is cut off before the first batch commits, so the promoted
// standby holds no offset row at all for the group, while Kafka holds the
// offsets the source committed there after those lost commits. The
// source does not take Kafka's offsets for the starting point then: it
// starts each such partition again from where it first started consuming
// it (kept with its Kafka commits), and every message ends with exactly
// one effect, whether the consumer ran on through the switch or was
// started again on the promoted standby.
func kafkaAsynchronousFailoverLosesTheFirstCommits(t *testing.T, newSource NewKafkaSource) {
	for _, restart := range []bool{false, true} {
		t.Run(map[bool]string{false: "running", true: "restarted"}[restart], func(t *testing.T) {
			p := startPair(t, false)
			k := newKafkaRun(t, p, newSource)
			src, r := k.start()

			cut, before := p.cutOff(k.h, k.g)
			if cut != 0 {
				t.Fatalf("%d messages applied before the standby was cut off, want none", cut)
			}
			// The consumer runs on while Kafka gets its commit: a batch
			// held at the gate may hold its partition's lowest offset
			// (its first attempt failed, say, when the gate kept its
			// transaction idle past the server's
			// idle_in_transaction_session_timeout, and it is being
			// retried), and nothing of that partition can be committed
			// until it commits. What it commits now is on the primary
			// alone, lost with it.
			k.g.release()
			committed := k.waitKafkaCommitted()
			promoted := p.killAndPromote(k.g)
			if restart {
				r = k.restart(src, r)
			}
			k.waitAll()
			r.Stop(t)
			final := p.effects(p.s.standby())
			t.Logf("N=%d: %d effects on the primary at the kill, Kafka offsets committed %v, %d effects on the promoted standby, %d at the end",
				messages, rows(before), committed, rows(promoted), rows(final))
			if rows(promoted) != 0 {
				t.Fatalf("the promoted standby has %d effects, want none: the test proves nothing", rows(promoted))
			}
			expectEach(t, final)
		})
	}
}

// An asynchronous failover that loses commits which did not move their
// partition's stored offset: partition 0's first message keeps failing, so
// the partition's commit point (the offset stored with each batch) stays
// at 0 while the batches after it commit. The standby is cut off, more of
// partition 0's batches commit on the primary alone, and the primary dies:
// the promoted standby lacks those commits, yet holds the same offset, 0,
// that the running consumer knows it stored. The source must still see
// that its partition went back and consume it again from the stored
// offset; every message ends with exactly one effect. (Before the source
// checked the highest offset committed as well, the lost batches were
// never applied: 135 of 3,000.)
func kafkaAsynchronousFailoverBehindARetry(t *testing.T, newSource NewKafkaSource) {
	p := startPair(t, false)
	k := newKafkaRun(t, p, newSource)
	k.failing.Store(true)
	_, r := k.start()

	k.h.waitApplied(t, messages/10)
	k.waitStored()
	k.g.hold(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.s.catchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.s.stopStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	atCut := p.effects(p.s.primary())
	k.g.release()
	// Wait for partition 0's batches to commit on the primary alone.
	k.waitPrimary(func(effects map[string]int) bool {
		return partitionGrew(atCut, effects, 0, 2*batchSize)
	})
	k.g.hold(t)
	before := p.effects(p.s.primary())
	promoted := p.killAndPromote(k.g)
	if !partitionGrew(promoted, before, 0, batchSize) {
		t.Fatalf("the promoted standby lacks fewer than %d of partition 0's effects: the test proves nothing", batchSize)
	}
	k.failing.Store(false)
	k.waitAll()
	r.Stop(t)
	expectEach(t, p.effects(p.s.standby()))
}

// waitPrimary waits until the primary's effects satisfy done, checked
// after each batch the consumer reports.
func (k *kafkaRun) waitPrimary(done func(map[string]int) bool) {
	k.t.Helper()
	timeout := time.After(time.Minute)
	for {
		k.h.mu.Lock()
		changed := k.h.changed
		k.h.mu.Unlock()
		if done(k.p.effects(k.p.s.primary())) {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			k.t.Fatal("the primary's effects did not reach the expected state within a minute")
		}
	}
}

// partitionGrew reports whether after holds at least n more effects of
// partition p's messages than before.
func partitionGrew(before, after map[string]int, p, n int) bool {
	count := func(effects map[string]int) int {
		c := 0
		for i := p; i < messages; i += partitions {
			c += effects["k-"+strconv.Itoa(i)]
		}
		return c
	}
	return count(after)-count(before) >= n
}

// missingByPartition describes the workload's messages without an effect
// in counts, by the partition they were produced to: how many, and the
// lowest and highest index.
func missingByPartition(counts map[string]int) map[int]string {
	out := map[int]string{}
	for p := range partitions {
		n, lo, hi := 0, -1, -1
		for i := p; i < messages; i += partitions {
			if counts["k-"+strconv.Itoa(i)] == 0 {
				n++
				if lo < 0 {
					lo = i
				}
				hi = i
			}
		}
		if n > 0 {
			out[p] = fmt.Sprintf("%d (k-%d..k-%d)", n, lo, hi)
		}
	}
	return out
}

// countRecords is a slog.Handler that counts in n the records whose
// message contains match.
type countRecords struct {
	slog.Handler
	match string
	n     *atomic.Int64
}

func (c *countRecords) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, c.match) {
		c.n.Add(1)
	}
	return c.Handler.Handle(ctx, r)
}

func (c *countRecords) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &countRecords{Handler: c.Handler.WithAttrs(attrs), match: c.match, n: c.n}
}

func (c *countRecords) WithGroup(name string) slog.Handler {
	return &countRecords{Handler: c.Handler.WithGroup(name), match: c.match, n: c.n}
}
