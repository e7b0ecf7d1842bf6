package bench

// The Kafka path's end-to-end latency: a franz-go producer writes at a
// fixed rate to an in-process Kafka (kfake), the consumer reads it with the
// kafka-go source and commits one ledger row per message, and each
// message's latency is the time from when it was due to be sent to when
// its batch's transaction committed. cmd/latencytable runs it at a list of
// rates, searches for the highest sustained rate, and prints the tables.

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The latency benchmark's fixed setting: partitions of its topic (and so
// lanes of the consumer) and the consumer's BatchSize.
const (
	LatencyPartitions = 4
	LatencyBatch      = 500
)

// SentAtHeader is the header that carries, in Unix nanoseconds, the time
// a latency benchmark record was due to be sent.
const SentAtHeader = "sent-at"

// Undrained stands, in a LatencyResult's percentiles, for the messages of
// the window that had not committed when the run gave up waiting.
const Undrained = time.Duration(math.MaxInt64)

// LatencyResult is one run of KafkaLatency.
type LatencyResult struct {
	Shape Shape
	// Rate is the offered rate, messages per second.
	Rate float64
	// Achieved is the rate at which messages committed during the
	// measured window (whenever they were sent).
	Achieved float64
	// P50, P99 and Max are the latencies, from the scheduled send time to
	// the commit, of the messages scheduled within the window; Undrained
	// where a message had not committed when the run stopped waiting.
	P50, P99, Max time.Duration
	// Samples is the number of messages scheduled within the window.
	Samples int
	// NotCommitted is how many of them had not committed when the run
	// stopped waiting (after the window plus LatencyOptions.Drain).
	NotCommitted int
	// LagStart and LagEnd are the messages due to have been sent but not
	// yet committed at the start and at the end of the window.
	LagStart, LagEnd int
	// ProducerLate is how late the producer handed its last record to
	// the client: above a few milliseconds, the producer could not keep
	// the schedule, and its lateness is counted in the latencies.
	ProducerLate time.Duration
	// Batch is the mean size of the batches that committed in the window.
	Batch float64
	// ToStart is the median time from the scheduled send to the start of
	// the message's batch (produce, broker, fetch, and waiting for the
	// lane); InBatch the median time from there to the commit (claim,
	// handler, COMMIT).
	ToStart, InBatch time.Duration
	// Claim, Handle and Commit are the mean times of those phases of the
	// batches that committed in the window (BatchStats).
	Claim, Handle, Commit time.Duration
	// Other counts messages settled otherwise than applied (retried,
	// duplicate, parked) and batches rolled back: none in a healthy run.
	Other int
	// OtherErr is the last of those outcomes' errors.
	OtherErr string
	// Tail is where the slowest 1% of the messages spent their time.
	Tail TailProfile
}

// Sustained says whether the consumer kept up with the offered rate: it
// committed at least 98% of it during the window, the lag did not grow by
// more than two batches per lane or 2% of the window's messages, and every
// message committed before the run stopped waiting.
func (r LatencyResult) Sustained() bool {
	allowed := max(2*LatencyPartitions*LatencyBatch, r.Samples/50)
	return r.Achieved >= 0.98*r.Rate && r.LagEnd-r.LagStart <= allowed && r.NotCommitted == 0
}

// KafkaLatency measures one handler shape at one offered rate: on a new
// topic of k with LatencyPartitions partitions, a consumer (idset,
// BatchSize LatencyBatch, one lane per partition, the ledger tables of
// Setup emptied first) runs while a franz-go producer sends rate messages a
// second for opts.Warmup and then opts.Duration, the measured window. The
// schedule is open-loop: message i is due at start + i/rate whatever
// happened before, and its latency counts from then, so that a consumer
// (or producer) that falls behind shows in the latencies instead of
// slowing the offered load. The topic is deleted afterwards.
func KafkaLatency(ctx context.Context, pool *pgxpool.Pool, k *kafkatest.Cluster, s Shape, rate float64, opts LatencyOptions) (LatencyResult, error) {
	opts.defaults()
	if rate <= 0 || math.IsInf(rate, 0) || math.IsNaN(rate) {
		return LatencyResult{}, fmt.Errorf("bench: the rate must be a positive number of messages per second, got %v", rate)
	}
	if err := Reset(ctx, pool); err != nil {
		return LatencyResult{}, err
	}
	topic := kafkatest.Name("latency")
	if err := k.CreateTopic(ctx, topic, LatencyPartitions); err != nil {
		return LatencyResult{}, err
	}
	// A 1 ms linger: records go out almost at once, and still in batches
	// at high rates (franz-go's default of 10 ms would add up to 10 ms).
	prod, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		return LatencyResult{}, fmt.Errorf("bench: producer: %w", err)
	}
	defer prod.Close()
	defer deleteTopic(context.WithoutCancel(ctx), prod, topic)

	clock := newCommitClock()
	if s == ShapeRaw {
		ready := make(chan struct{})
		return measureLatency(ctx, pool, prod, clock, s, rate, opts, func(ctx context.Context) error {
			return rawConsume(ctx, pool, k.Brokers(), topic, clock, ready)
		}, ready, func() error {
			return fmt.Errorf("bench: the hand-written consumer could not fetch every partition within a minute")
		})
	}
	assigned := make(chan struct{})
	var nAssigned atomic.Int64
	var assignOnce sync.Once
	src, err := kafka.New(pool, kafka.Config{Brokers: k.Brokers(), Group: kafkatest.Name("latency"), Topics: []string{topic},
		MaxWait: kafkatest.MaxWait, SessionTimeout: kafkatest.SessionTimeout, HeartbeatInterval: kafkatest.HeartbeatInterval,
		Pipeline: opts.Pipeline,
		OnAssigned: func(_ context.Context, ps []kafka.TopicPartition) {
			if nAssigned.Add(int64(len(ps))) >= LatencyPartitions {
				assignOnce.Do(func() { close(assigned) })
			}
		}})
	if err != nil {
		return LatencyResult{}, err
	}
	defer func() { _ = src.Close() }() // leaves the group and stops its fetches before the topic goes
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		return LatencyResult{}, err
	}
	// With Pipeline, two goroutines a lane: a lane's next batch claims
	// while its last one commits (consumer.PipelineSource).
	concurrency := LatencyPartitions
	if opts.Pipeline {
		concurrency *= 2
	}
	cfg := consumer.Config{Name: "bench", Strategy: strategy, BatchSize: LatencyBatch, Concurrency: concurrency,
		Hooks: []consumer.Hook{clock}}
	s.configure(&cfg)
	c, err := consumer.New(pool, src, cfg)
	if err != nil {
		return LatencyResult{}, err
	}
	if err := c.Migrate(ctx); err != nil {
		return LatencyResult{}, err
	}

	return measureLatency(ctx, pool, prod, clock, s, rate, opts, c.Run, assigned, func() error {
		return fmt.Errorf("bench: %d of %d partitions assigned after a minute", nAssigned.Load(), LatencyPartitions)
	})
}

// measureLatency runs run (a consumer of the benchmark's topic reporting
// to clock) until the end of one latency run: once ready is closed (the
// consumer fetches every partition), prod sends the messages at rate for
// opts.Warmup and opts.Duration; the result is the window's, once every
// message committed or opts.Drain passed. notReady is the error when
// ready is not closed within a minute.
func measureLatency(ctx context.Context, pool *pgxpool.Pool, prod *kgo.Client, clock *commitClock, s Shape, rate float64, opts LatencyOptions,
	run func(context.Context) error, ready <-chan struct{}, notReady func() error) (LatencyResult, error) {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	finished := make(chan struct{})
	var runErr error
	go func() { runErr = run(runCtx); close(finished) }()
	defer func() { cancel(); <-finished }() // on every return, before the source closes
	stopped := func() error { return fmt.Errorf("the consumer stopped during the run: %v", runErr) }
	select {
	case <-ready:
	case <-finished:
		return LatencyResult{}, stopped()
	case <-ctx.Done():
		return LatencyResult{}, ctx.Err()
	case <-time.After(time.Minute):
		return LatencyResult{}, notReady()
	}

	// Messages first, …, total-1 make the window, which runs from the
	// time the first of them is due to the time the one after the last
	// would be: the clock, which goes by the due time each message
	// carries, and the count here agree exactly.
	start := time.Now()
	first := int(math.Round(opts.Warmup.Seconds() * rate))
	total := first + max(1, int(math.Round(opts.Duration.Seconds()*rate)))
	due := func(i int) time.Time { return start.Add(time.Duration(float64(i) * float64(time.Second) / rate)) }
	scheduled := func(t time.Time) int { return min(total, int(math.Ceil(t.Sub(start).Seconds()*rate))) }
	w0, w1 := due(first), due(total)
	clock.set(w0, w1, total)
	produced := make(chan produceResult, 1)
	go func() { produced <- produceAt(runCtx, prod, total, due) }()

	// lagAt waits until t and returns the messages due by then that have
	// not committed.
	lagAt := func(t time.Time) (int, error) {
		select {
		case <-time.After(time.Until(t)):
		case <-finished:
			return 0, stopped()
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		return scheduled(t) - int(clock.applied.Load()), nil
	}
	res := LatencyResult{Shape: s, Rate: rate}
	var err error
	if res.LagStart, err = lagAt(w0); err != nil {
		return LatencyResult{}, err
	}
	if res.LagEnd, err = lagAt(w1); err != nil {
		return LatencyResult{}, err
	}
	var pr produceResult
	select {
	case pr = <-produced:
	case <-finished:
		return LatencyResult{}, stopped()
	}
	if pr.err != nil {
		return LatencyResult{}, fmt.Errorf("bench: producing at %.0f msgs/s: %w", rate, pr.err)
	}
	res.ProducerLate = pr.late
	select {
	case <-clock.all:
	case <-finished:
		return LatencyResult{}, stopped()
	case <-ctx.Done():
		return LatencyResult{}, ctx.Err()
	case <-time.After(time.Until(w1.Add(opts.Drain))):
	}
	cancel()
	<-finished
	if runErr != nil {
		return LatencyResult{}, fmt.Errorf("bench: consumer: %w", runErr)
	}
	clock.result(&res, w1.Sub(w0), total-first)
	if res.NotCommitted == 0 {
		var rows int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&rows); err != nil {
			return LatencyResult{}, err
		}
		if rows != total {
			return LatencyResult{}, fmt.Errorf("bench: the ledger has %d rows after %d messages", rows, total)
		}
	}
	return res, nil
}

type produceResult struct {
	late time.Duration
	err  error
}

// produceAt sends messages 0 to total-1 of the benchmarks' message set,
// each at its due time or as soon after as the client takes it, with the
// due time in the SentAtHeader header and the ID in idempotency-key, then
// waits for the broker's acknowledgements.
func produceAt(ctx context.Context, cl *kgo.Client, total int, due func(int) time.Time) produceResult {
	var failed atomic.Pointer[error]
	done := func(_ *kgo.Record, err error) {
		if err != nil {
			failed.CompareAndSwap(nil, &err)
		}
	}
	var late time.Duration
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i := 0; i < total; {
		if next := due(i); time.Until(next) > 0 {
			timer.Reset(time.Until(next))
			select {
			case <-timer.C:
			case <-ctx.Done():
				return produceResult{err: ctx.Err()}
			}
		}
		for now := time.Now(); i < total && !due(i).After(now); i++ {
			at := due(i)
			id, account, _, payload := message(i)
			cl.Produce(ctx, &kgo.Record{Key: []byte(account), Value: payload, Headers: []kgo.RecordHeader{
				{Key: kafka.DefaultIDHeader, Value: []byte(id)},
				{Key: SentAtHeader, Value: strconv.AppendInt(nil, at.UnixNano(), 10)},
			}}, done)
			if i == total-1 {
				late = time.Since(at)
			}
		}
		if p := failed.Load(); p != nil {
			return produceResult{err: *p}
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return produceResult{err: err}
	}
	if p := failed.Load(); p != nil {
		return produceResult{err: *p}
	}
	return produceResult{late: late}
}

// deleteTopic deletes topic, so that a run's records do not stay in the
// in-process cluster's memory.
func deleteTopic(ctx context.Context, cl *kgo.Client, topic string) {
	req := kmsg.NewPtrDeleteTopicsRequest()
	t := kmsg.NewDeleteTopicsRequestTopic()
	t.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, t)
	req.TopicNames = []string{topic}
	req.TimeoutMillis = 10000
	_, _ = req.RequestWith(ctx, cl)
}
