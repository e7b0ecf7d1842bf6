package bench

// The outbox's benchmarks: what one emit per message costs the engine's
// BatchHandler, how fast the relay publishes against a plain kafka-go
// Writer, and how long a committed message waits before it is published.
// cmd/outboxtable runs them side by side and prints BENCHMARKS.md's table.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

// OutboxSink is the sink name the outbox benchmarks emit to.
const OutboxSink = "bench"

// SetupOutbox creates the tables of Setup and the outbox's, and returns
// the outbox, in TableMode: what the table-polling relay reads (and the
// log relay too).
func SetupOutbox(ctx context.Context, pool *pgxpool.Pool) (*outbox.Outbox, error) {
	if err := Setup(ctx, pool); err != nil {
		return nil, err
	}
	ob, err := OutboxMode(outbox.TableMode)
	if err != nil {
		return nil, err
	}
	if _, err := pg.Migrate(ctx, pool, "", ob.Line()); err != nil {
		return nil, err
	}
	return ob, ResetOutbox(ctx, pool)
}

// OutboxMode returns an Outbox of mode on the tables SetupOutbox made.
func OutboxMode(mode outbox.Mode) (*outbox.Outbox, error) {
	return outbox.New(outbox.Config{Sinks: []string{OutboxSink}, Mode: mode})
}

// ResetOutbox empties the tables of Reset and the outbox's.
func ResetOutbox(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `TRUNCATE effectively.outbox, effectively.outbox_counters, effectively.outbox_log`); err != nil {
		return err
	}
	for _, q := range []string{`VACUUM ANALYZE effectively.outbox`, `VACUUM ANALYZE effectively.outbox_counters`, `VACUUM ANALYZE effectively.outbox_log`} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	return Reset(ctx, pool)
}

// EngineEmit is Engine(true) with one outbox message per input, emitted
// in the batch's transaction with one Emit call (key: the account).
func EngineEmit(ob *outbox.Outbox) func(ctx context.Context, pool *pgxpool.Pool, n, batch int) (time.Duration, error) {
	return func(ctx context.Context, pool *pgxpool.Pool, n, batch int) (time.Duration, error) {
		cfg := consumer.Config{Name: "bench", BatchSize: batch, Concurrency: 1,
			BatchHandler: func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
				ids := make([]string, len(msgs))
				accounts := make([]string, len(msgs))
				amounts := make([]int64, len(msgs))
				out := make([]outbox.Message, len(msgs))
				for i, m := range msgs {
					var t transfer
					if err := json.Unmarshal(m.Value, &t); err != nil {
						return consumer.Permanent(err)
					}
					ids[i], accounts[i], amounts[i] = t.ID, t.Account, t.Amount
					out[i] = outbox.Message{Sink: OutboxSink, Key: []byte(t.Account), Value: m.Value, ID: outbox.ID(m, 0)}
				}
				if _, err := tx.Exec(ctx, `INSERT INTO ledger (msg_id, account, amount)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`, ids, accounts, amounts); err != nil {
					return err
				}
				return ob.Emit(ctx, tx, out...)
			}}
		return runEmit(ctx, pool, cfg, n)
	}
}

// EngineQueueEmit is EngineQueue with one outbox message per input,
// queued with the input's INSERT by EmitQueued (key: the account); the
// consumer sends the batch's emits as one INSERT.
func EngineQueueEmit(ob *outbox.Outbox) func(ctx context.Context, pool *pgxpool.Pool, n, batch int) (time.Duration, error) {
	return func(ctx context.Context, pool *pgxpool.Pool, n, batch int) (time.Duration, error) {
		cfg := consumer.Config{Name: "bench", BatchSize: batch, Concurrency: 1,
			QueueHandler: consumer.JSONQueue(func(ctx context.Context, q consumer.Queue, m *consumer.Message, t transfer) error {
				q.Queue(`INSERT INTO ledger (msg_id, account, amount) VALUES ($1, $2, $3)`, t.ID, t.Account, t.Amount)
				return ob.EmitQueued(q, m, outbox.Message{Sink: OutboxSink, Key: []byte(t.Account), Value: m.Value})
			})}
		return runEmit(ctx, pool, cfg, n)
	}
}

// runEmit runs a consumer of cfg (with the idset strategy) over n inputs
// until it is idle, and checks that each left one ledger row and one
// outbox row.
func runEmit(ctx context.Context, pool *pgxpool.Pool, cfg consumer.Config, n int) (time.Duration, error) {
	broker := consumertest.New(consumertest.Config{Lanes: 1})
	for i := range n {
		id, _, _, payload := message(i)
		broker.Publish(0, consumer.Message{ID: id, Value: payload})
	}
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		return 0, err
	}
	cfg.Strategy = strategy
	c, err := consumer.New(pool, broker, cfg)
	if err != nil {
		return 0, err
	}
	elapsed, err := runUntilIdle(ctx, c, broker)
	if err != nil {
		return 0, err
	}
	var rows, emitted int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ledger), (SELECT count(*) FROM effectively.outbox) + (SELECT coalesce(sum(n), 0) FROM effectively.outbox_log)`).Scan(&rows, &emitted); err != nil {
		return 0, err
	}
	if rows != n || emitted != n {
		return 0, fmt.Errorf("%d ledger rows and %d outbox rows after %d messages", rows, emitted, n)
	}
	return elapsed, nil
}

// outboxMessages returns the n messages the relay benchmarks publish.
func outboxMessages(n int) []outbox.Message {
	out := make([]outbox.Message, n)
	for i := range out {
		id, account, _, payload := message(i)
		out[i] = outbox.Message{Sink: OutboxSink, Key: []byte(account), Value: payload, ID: id}
	}
	return out
}

// KafkaWriter returns the Writer both relay benchmarks write to topic
// with: key-hashed, synchronous, batches of up to 1,000.
func KafkaWriter(k *kafkatest.Cluster, topic string) *kafkago.Writer {
	return &kafkago.Writer{Addr: kafkago.TCP(k.Brokers()...), Topic: topic, Balancer: &kafkago.Hash{},
		BatchTimeout: kafkatest.BatchTimeout, BatchSize: 1000, BatchBytes: 16 << 20, RequiredAcks: kafkago.RequireAll}
}

// RelayThroughput emits n messages (untimed), then times one relay with
// the given RelayConfig.Retention publishing them all to topic, until none
// is left unpublished.
func RelayThroughput(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, k *kafkatest.Cluster, topic string, n int, retention time.Duration) (time.Duration, error) {
	msgs := outboxMessages(n)
	for lo := 0; lo < n; lo += 1000 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ob.Emit(ctx, tx, msgs[lo:min(lo+1000, n)]...) })
		if err != nil {
			return 0, err
		}
	}
	w := KafkaWriter(k, topic)
	defer w.Close()
	sink, err := outbox.NewKafkaSink(w)
	if err != nil {
		return 0, err
	}
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Sinks: map[string]outbox.Sink{OutboxSink: sink}, BatchSize: 1000, PollInterval: 20 * time.Millisecond, Retention: retention})
	if err != nil {
		return 0, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	for {
		var left int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM effectively.outbox WHERE published_at IS NULL`).Scan(&left); err != nil {
			return 0, err
		}
		if left == 0 {
			break
		}
		select {
		case err := <-done:
			return 0, fmt.Errorf("relay stopped early: %v", err)
		case <-time.After(2 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	cancel()
	return elapsed, <-done
}

// WriterThroughput writes the messages RelayThroughput publishes (with the
// same headers) straight to topic with a plain kafka-go Writer, 1,000 per
// call.
func WriterThroughput(ctx context.Context, k *kafkatest.Cluster, topic string, n int) (time.Duration, error) {
	msgs := outboxMessages(n)
	kms := make([]kafkago.Message, n)
	for i, m := range msgs {
		kms[i] = kafkago.Message{Key: m.Key, Value: m.Value, Headers: []kafkago.Header{{Key: outbox.IDHeader, Value: []byte(m.ID)}}}
	}
	w := KafkaWriter(k, topic)
	defer w.Close()
	start := time.Now()
	for lo := 0; lo < n; lo += 1000 {
		if err := w.WriteMessages(ctx, kms[lo:min(lo+1000, n)]...); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// timedSink records, for each message it publishes, the time from its
// commit (as the emitter noted it) to the end of the publish.
type timedSink struct {
	inner   outbox.Sink
	mu      sync.Mutex
	commits map[string]time.Time
	lat     []time.Duration
}

func (s *timedSink) Publish(ctx context.Context, msgs []outbox.Message) error {
	if err := s.inner.Publish(ctx, msgs); err != nil {
		return err
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		if t, ok := s.commits[m.ID]; ok {
			s.lat = append(s.lat, now.Sub(t))
			delete(s.commits, m.ID)
		}
	}
	return nil
}

// Latency is the result of one commit-to-publish measurement.
type Latency struct {
	P50, P99 time.Duration
	Samples  int
	Load     int // messages emitted by the background load
}

// CommitToPublish emits probes one at a time, one every 10 ms, each in its
// own transaction, and measures the time from the start of its COMMIT to
// the end of the relay's publish of it (so the commit's own time counts).
// With load, another goroutine emits 100 messages to other keys every
// 20 ms meanwhile (5,000 a second, in one transaction per 100). pollOnly turns the relay's LISTEN off
// (it polls every PollInterval, the default 1 s).
func CommitToPublish(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, k *kafkatest.Cluster, topic string, probes int, load, pollOnly bool) (Latency, error) {
	return commitToPublish(ctx, pool, ob, k, topic, probes, load, 0, func(ctx context.Context, sink outbox.Sink) (func(context.Context) error, error) {
		r, err := outbox.NewRelay(pool, outbox.RelayConfig{Sinks: map[string]outbox.Sink{OutboxSink: sink}, BatchSize: 1000, PollOnly: pollOnly})
		if err != nil {
			return nil, err
		}
		return r.Run, nil
	})
}

// LogCommitToPublish is CommitToPublish with an outbox.LogRelay, which
// reads its slot (created beforehand, and dropped after). batchTimeout,
// when not 0, replaces the Writer's BatchTimeout (kafkatest.BatchTimeout):
// a publish smaller than the Writer's BatchSize waits that long.
func LogCommitToPublish(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, k *kafkatest.Cluster, topic string, probes int, load bool, batchTimeout time.Duration) (Latency, error) {
	var lr *outbox.LogRelay
	defer func() {
		if lr != nil {
			_ = dropSlot(context.WithoutCancel(ctx), pool, lr.Stats().Slot)
		}
	}()
	return commitToPublish(ctx, pool, ob, k, topic, probes, load, batchTimeout, func(ctx context.Context, sink outbox.Sink) (func(context.Context) error, error) {
		var err error
		lr, err = readyLogRelay(ctx, pool, outbox.LogRelayConfig{Sinks: map[string]outbox.Sink{OutboxSink: sink}, BatchSize: 1000})
		if err != nil {
			return nil, err
		}
		return lr.Run, nil
	})
}

// commitToPublish measures with the relay that start returns the Run of.
func commitToPublish(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, k *kafkatest.Cluster, topic string, probes int, load bool,
	batchTimeout time.Duration, start func(context.Context, outbox.Sink) (func(context.Context) error, error)) (Latency, error) {
	w := KafkaWriter(k, topic)
	if batchTimeout > 0 {
		w.BatchTimeout = batchTimeout
	}
	defer w.Close()
	ks, err := outbox.NewKafkaSink(w)
	if err != nil {
		return Latency{}, err
	}
	sink := &timedSink{inner: ks, commits: map[string]time.Time{}}
	run, err := start(ctx, sink)
	if err != nil {
		return Latency{}, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(runCtx) }()

	var loaded atomic.Int64
	loadDone := make(chan error, 1)
	if load {
		go func() {
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for b := 0; runCtx.Err() == nil; b++ {
				select {
				case <-tick.C:
				case <-runCtx.Done():
					continue
				}
				msgs := outboxMessages(100)
				for i := range msgs {
					msgs[i].ID = "load-" + strconv.Itoa(b) + "-" + strconv.Itoa(i)
				}
				if err := pgx.BeginFunc(runCtx, pool, func(tx pgx.Tx) error { return ob.Emit(runCtx, tx, msgs...) }); err != nil {
					if runCtx.Err() != nil {
						break
					}
					loadDone <- err
					return
				}
				loaded.Add(100)
			}
			loadDone <- nil
		}()
	} else {
		loadDone <- nil
	}

	// The relay's LISTEN is in place once a probe committed after it is
	// published fast; the first probes are not counted.
	const warmup = 5
	for i := range probes + warmup {
		id := fmt.Sprintf("probe-%d-%d", time.Now().UnixNano(), i)
		tx, err := pool.Begin(ctx)
		if err != nil {
			return Latency{}, err
		}
		if err := ob.Emit(ctx, tx, outbox.Message{Sink: OutboxSink, Key: []byte("probe"), Value: []byte(id), ID: id}); err != nil {
			_ = tx.Rollback(ctx)
			return Latency{}, err
		}
		if i >= warmup {
			sink.mu.Lock()
			sink.commits[id] = time.Now()
			sink.mu.Unlock()
		}
		if err := tx.Commit(ctx); err != nil {
			return Latency{}, err
		}
		select {
		case err := <-done:
			return Latency{}, fmt.Errorf("relay stopped early: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	// Wait for the last probes.
	for deadline := time.Now().Add(30 * time.Second); ; {
		sink.mu.Lock()
		n := len(sink.lat)
		sink.mu.Unlock()
		if n == probes {
			break
		}
		if time.Now().After(deadline) {
			return Latency{}, fmt.Errorf("%d of %d probes published after 30 s", n, probes)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-loadDone; err != nil {
		return Latency{}, err
	}
	if err := <-done; err != nil {
		return Latency{}, err
	}
	lat := slices.Clone(sink.lat)
	slices.Sort(lat)
	return Latency{P50: lat[len(lat)/2], P99: lat[(len(lat)*99)/100], Samples: len(lat), Load: int(loaded.Load())}, nil
}

// readyLogRelay returns a LogRelay whose slot exists and is ready: it runs
// one until it reads the slot (creating it, and publishing what the table
// holds) and stops it, so that the next Run reads from the slot.
func readyLogRelay(ctx context.Context, pool *pgxpool.Pool, cfg outbox.LogRelayConfig) (*outbox.LogRelay, error) {
	r, err := outbox.NewLogRelay(pool, cfg)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	for !r.Stats().Active {
		select {
		case err := <-done:
			cancel()
			return nil, fmt.Errorf("log relay stopped early: %v", err)
		case <-time.After(2 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		return nil, err
	}
	// The server lets go of the slot a moment after the relay closed its
	// connection; until then the next Run would stand by.
	for active := true; active; {
		if err := pool.QueryRow(ctx, `SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1`, r.Stats().Slot).Scan(&active); err != nil {
			return nil, err
		}
		time.Sleep(time.Millisecond)
	}
	return r, nil
}

// dropSlot drops a log relay's slot, so that the next run starts afresh
// (the other benchmarks' emits are not in it).
func dropSlot(ctx context.Context, pool *pgxpool.Pool, slot string) error {
	for i := 0; ; i++ {
		_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		if err == nil || i == 100 {
			return err
		}
		time.Sleep(20 * time.Millisecond) // the stopped reader lets go of it
	}
}

// LogRelayThroughput emits n messages (untimed) while the log relay is
// stopped, its slot ready, then times one LogRelay publishing them all to
// topic from its slot. The slot is dropped afterwards.
func LogRelayThroughput(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, k *kafkatest.Cluster, topic string, n int) (time.Duration, error) {
	w := KafkaWriter(k, topic)
	defer w.Close()
	sink, err := outbox.NewKafkaSink(w)
	if err != nil {
		return 0, err
	}
	r, err := readyLogRelay(ctx, pool, outbox.LogRelayConfig{Sinks: map[string]outbox.Sink{OutboxSink: sink}, BatchSize: 1000})
	if err != nil {
		return 0, err
	}
	defer func() { _ = dropSlot(context.WithoutCancel(ctx), pool, r.Stats().Slot) }()
	before := r.Stats().Published
	msgs := outboxMessages(n)
	for lo := 0; lo < n; lo += 1000 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return ob.Emit(ctx, tx, msgs[lo:min(lo+1000, n)]...) })
		if err != nil {
			return 0, err
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	for r.Stats().Published-before < int64(n) {
		select {
		case err := <-done:
			return 0, fmt.Errorf("log relay stopped early: %v", err)
		case <-time.After(2 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	cancel()
	return elapsed, <-done
}
