package bench

// The two-stage chain's benchmark: Kafka → stage A (a BatchHandler that
// writes its effects and emits one message per input) → the log relay →
// Kafka → stage B (a BatchHandler), against stage A alone (the same
// BatchHandler without emits, and no relay), on the same inputs.
// cmd/chaintable runs them side by side.

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

// ChainPartitions is the number of partitions of the chain benchmark's
// topics: the lanes each stage runs.
const ChainPartitions = 4

// ChainResult is one run of a chain benchmark.
type ChainResult struct {
	// Messages is the number of inputs timed: those after the first batch
	// of stage A (its group's join is not timed).
	Messages int
	// Elapsed is the time from the end of stage A's first batch to the
	// last input's effect at the last stage.
	Elapsed time.Duration
	// StageA is, in a chain, the time from the same start until stage A
	// had applied every input.
	StageA time.Duration
	// Relay is the log relay's stats at the end (zero for stage A alone).
	Relay outbox.LogStats
}

// Rate is the result's throughput in messages per second.
func (r ChainResult) Rate() float64 { return float64(r.Messages) / r.Elapsed.Seconds() }

// SetupChain creates the second stage's effect table, beside Setup's.
func SetupChain(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS ledger_b (
    msg_id  text   NOT NULL,
    account text   NOT NULL,
    amount  bigint NOT NULL
);
TRUNCATE ledger_b`)
	return err
}

// ProduceInputs writes the n inputs of the engine benchmarks to a new
// topic of k, keyed by account, each with its ID in the idempotency-key
// header, and returns the topic.
func ProduceInputs(ctx context.Context, k *kafkatest.Cluster, n int) (string, error) {
	topic := kafkatest.Name("chain-in")
	if err := k.CreateTopic(ctx, topic, ChainPartitions); err != nil {
		return "", err
	}
	w := KafkaWriter(k, topic)
	w.Transport = &kafkago.Transport{} // see Chain
	defer w.Close()
	batch := make([]kafkago.Message, 0, 5000)
	for i := range n {
		id, account, _, payload := message(i)
		batch = append(batch, kafkago.Message{Key: []byte(account), Value: payload,
			Headers: []kafkago.Header{{Key: "idempotency-key", Value: []byte(id)}}})
		if len(batch) == cap(batch) || i == n-1 {
			if err := w.WriteMessages(ctx, batch...); err != nil {
				return "", err
			}
			batch = batch[:0]
		}
	}
	return topic, nil
}

// stageClock is a consumer hook timing a stage: the end of its first
// batch, and the moment it has applied want messages.
type stageClock struct {
	want    int
	applied atomic.Int64
	mu      sync.Mutex
	first   time.Time
	firstN  int
	done    chan struct{}
	doneAt  time.Time
	failed  atomic.Int64
	lastErr atomic.Value
}

func newStageClock(want int) *stageClock { return &stageClock{want: want, done: make(chan struct{})} }

func (c *stageClock) BatchDone(_ context.Context, s *consumer.BatchStats) {
	if s.Err != nil {
		c.failed.Add(1)
		c.lastErr.Store(s.Err.Error())
	}
	if s.Parked > 0 {
		c.lastErr.Store(fmt.Sprintf("%d messages parked", s.Parked))
	}
	n := c.applied.Add(int64(s.Applied))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.first.IsZero() && s.Applied > 0 {
		c.first, c.firstN = time.Now(), s.Applied
	}
	if n >= int64(c.want) && c.doneAt.IsZero() {
		c.doneAt = time.Now()
		close(c.done)
	}
}

var _ consumer.Hook = (*stageClock)(nil)

// chainStage is a consumer over a new group of topic with a BatchHandler
// that decodes the inputs, writes them to table with one unnest statement
// and, with ob, emits one message per input with one Emit call.
func chainStage(pool *pgxpool.Pool, k *kafkatest.Cluster, name, topic, table string, ob *outbox.Outbox, clock *stageClock) (*consumer.Consumer, error) {
	src, err := kafka.New(pool, kafka.Config{Brokers: k.Brokers(), Group: kafkatest.Name(name), Topics: []string{topic},
		MaxWait: kafkatest.MaxWait, SessionTimeout: kafkatest.SessionTimeout, HeartbeatInterval: kafkatest.HeartbeatInterval})
	if err != nil {
		return nil, err
	}
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		return nil, err
	}
	insert := `INSERT INTO ` + pgx.Identifier{table}.Sanitize() + ` (msg_id, account, amount)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`
	c, err := consumer.New(pool, src, consumer.Config{Name: name, Strategy: strategy, BatchSize: 500,
		Concurrency: ChainPartitions, Hooks: []consumer.Hook{clock},
		BatchHandler: func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
			ids := make([]string, len(msgs))
			accounts := make([]string, len(msgs))
			amounts := make([]int64, len(msgs))
			var out []outbox.Message
			if ob != nil {
				out = make([]outbox.Message, len(msgs))
			}
			for i, m := range msgs {
				var t transfer
				if err := json.Unmarshal(m.Value, &t); err != nil {
					return consumer.Permanent(err)
				}
				ids[i], accounts[i], amounts[i] = t.ID, t.Account, t.Amount
				if ob != nil {
					out[i] = outbox.Message{Sink: OutboxSink, Key: []byte(t.Account), Value: m.Value, ID: outbox.ID(m, 0)}
				}
			}
			if _, err := tx.Exec(ctx, insert, ids, accounts, amounts); err != nil {
				return err
			}
			if ob == nil {
				return nil
			}
			return ob.Emit(ctx, tx, out...)
		}})
	if err != nil {
		return nil, err
	}
	if err := c.Migrate(context.Background()); err != nil {
		return nil, err
	}
	return c, nil
}

// StageAlone times stage A alone consuming the n inputs of topic into the
// ledger table: with ob nil, without emits; with ob, emitting one message
// per input that no relay publishes (what the emits cost stage A).
func StageAlone(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, k *kafkatest.Cluster, topic string, n int) (ChainResult, error) {
	clock := newStageClock(n)
	c, err := chainStage(pool, k, "stage-a", topic, "ledger", ob, clock)
	if err != nil {
		return ChainResult{}, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	if err := waitClock(ctx, clock, done, 5*time.Minute); err != nil {
		return ChainResult{}, fmt.Errorf("stage A alone: %w", err)
	}
	cancel()
	if err := <-done; err != nil {
		return ChainResult{}, err
	}
	return ChainResult{Messages: n - clock.firstN, Elapsed: clock.doneAt.Sub(clock.first)}, nil
}

// Chain times the two-stage chain on the n inputs of topic: stage A (the
// ledger, one emit per input), a log relay whose slot was created before,
// a new topic and stage B (ledger_b), all running at once; the time ends
// when stage B has applied every input. The relay's slot is dropped
// afterwards.
func Chain(ctx context.Context, pool *pgxpool.Pool, ob *outbox.Outbox, k *kafkatest.Cluster, topic string, n int) (ChainResult, error) {
	out := kafkatest.Name("chain-out")
	if err := k.CreateTopic(ctx, out, ChainPartitions); err != nil {
		return ChainResult{}, err
	}
	w := KafkaWriter(k, out)
	// A Transport of its own: the default one caches the cluster's
	// metadata from before the topic existed, and the sink would take
	// the topic for unknown.
	w.Transport = &kafkago.Transport{}
	defer w.Close()
	sink, err := outbox.NewKafkaSink(w)
	if err != nil {
		return ChainResult{}, err
	}
	r, err := readyLogRelay(ctx, pool, outbox.LogRelayConfig{Sinks: map[string]outbox.Sink{OutboxSink: sink}, BatchSize: 1000})
	if err != nil {
		return ChainResult{}, err
	}
	defer func() { _ = dropSlot(context.WithoutCancel(ctx), pool, r.Stats().Slot) }()
	clockA, clockB := newStageClock(n), newStageClock(n)
	a, err := chainStage(pool, k, "stage-a", topic, "ledger", ob, clockA)
	if err != nil {
		return ChainResult{}, err
	}
	b, err := chainStage(pool, k, "stage-b", out, "ledger_b", nil, clockB)
	if err != nil {
		return ChainResult{}, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 3)
	go func() { done <- r.Run(runCtx) }()
	go func() { done <- b.Run(runCtx) }()
	go func() { done <- a.Run(runCtx) }()
	if err := waitClock(ctx, clockB, done, 5*time.Minute); err != nil {
		return ChainResult{}, fmt.Errorf("chain (stage A applied %d, relay %+v): %w", clockA.applied.Load(), r.Stats(), err)
	}
	cancel()
	for range 3 {
		if err := <-done; err != nil {
			return ChainResult{}, err
		}
	}
	clockA.mu.Lock()
	first, firstN := clockA.first, clockA.firstN
	clockA.mu.Unlock()
	return ChainResult{Messages: n - firstN, Elapsed: clockB.doneAt.Sub(first), StageA: clockA.doneAt.Sub(first), Relay: r.Stats()}, nil
}

// waitClock waits for clock's stage to have applied its inputs.
func waitClock(ctx context.Context, clock *stageClock, done chan error, timeout time.Duration) error {
	select {
	case <-clock.done:
		return nil
	case err := <-done:
		return fmt.Errorf("stopped early: %v", err)
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(timeout):
		last, _ := clock.lastErr.Load().(string)
		return fmt.Errorf("%d of %d applied after %s (%d failed batches, last: %s)", clock.applied.Load(), clock.want, timeout, clock.failed.Load(), last)
	}
}
