package peers

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Options size a run. Every field's zero value means its default.
type Options struct {
	// Messages is N for this library's shapes in the throughput phase.
	// Defaults to 100,000.
	Messages int
	// PeerMessages is N for the other systems in the throughput phase.
	// Defaults to 10,000.
	PeerMessages int
	// CrashMessages is N in the crash phase, for every system. Defaults to
	// 10,000.
	CrashMessages int
	// DupEvery: every DupEvery-th message is produced twice. Defaults to 20.
	DupEvery int
	// DupLag: the copy comes this many messages after the original.
	// Defaults to 100.
	DupLag int
	// Runs is the number of throughput runs per system; the median rate is
	// reported. Defaults to 3.
	Runs int
	// Partitions of every topic. Defaults to 4.
	Partitions int
	// SessionTimeout of every consumer group member: a killed consumer's
	// partitions move to the fresh one after it. Defaults to 6s.
	SessionTimeout time.Duration
	// WorkerTimeout bounds one worker process. Defaults to 10 minutes.
	WorkerTimeout time.Duration
	// DatabaseURL, when set, is the database to use (its ledger,
	// processed_ids and effectively tables are emptied); otherwise a
	// throwaway PostgreSQL with fsync on is started.
	DatabaseURL string
	// Only, when set, keeps the systems whose name contains one of them.
	Only []string
	// Log receives progress lines. Defaults to io.Discard.
	Log io.Writer
}

func (o Options) withDefaults() Options {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Messages, 100_000)
	def(&o.PeerMessages, 10_000)
	def(&o.CrashMessages, 10_000)
	def(&o.DupEvery, 20)
	def(&o.DupLag, 100)
	def(&o.Runs, 3)
	def(&o.Partitions, 4)
	if o.SessionTimeout == 0 {
		o.SessionTimeout = 6 * time.Second
	}
	if o.WorkerTimeout == 0 {
		o.WorkerTimeout = 10 * time.Minute
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	return o
}

// Result is one system's line of the table.
type Result struct {
	System System
	// Throughput is the throughput phase's workload.
	Throughput Workload
	// Rates are records per second of each throughput run; Rate is their
	// median.
	Rates []float64
	Rate  float64
	// NoCrash is the worst of the throughput runs' effects.
	NoCrash Effects
	// Crash is what the crash phase left; CrashAt is the record count at
	// which its first consumer killed itself.
	Crash   Effects
	CrashAt int
}

// Report is the outcome of Run.
type Report struct {
	Options   Options
	Crash     Workload
	Postgres  string
	Results   []*Result
	StartedAt time.Time
}

// env is the shared Kafka and PostgreSQL of a run.
type env struct {
	opts    Options
	brokers []string
	pool    *pgxpool.Pool
	url     string
	topics  map[Workload]topic
}

type topic struct {
	name string
	ends map[int32]int64
}

// Run starts kfake and PostgreSQL, runs every system's throughput phase
// Options.Runs times (interleaved, so the machine's changing load falls on
// all alike) and then its crash phase, and returns the results. The
// process must call MaybeWorker at start: the consumers run in copies of
// it.
func Run(ctx context.Context, opts Options) (*Report, error) {
	opts = opts.withDefaults()
	rep := &Report{Options: opts, StartedAt: time.Now().UTC()}
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(opts.Partitions), kfake.GroupMinSessionTimeout(time.Second))
	if err != nil {
		return nil, fmt.Errorf("start kfake: %w", err)
	}
	defer fake.Close()
	e := &env{opts: opts, brokers: fake.ListenAddrs(), topics: map[Workload]topic{}, url: opts.DatabaseURL}
	if e.url == "" {
		fmt.Fprintln(opts.Log, "starting a throwaway PostgreSQL (fsync on)…")
		pg, err := pgtest.Start(ctx, pgtest.Options{Fsync: true})
		if err != nil {
			return nil, err
		}
		defer pg.Stop()
		if e.url, err = pg.CreateDatabase(ctx, "peers"); err != nil {
			return nil, err
		}
	}
	if e.pool, err = pgxpool.New(ctx, e.url); err != nil {
		return nil, err
	}
	defer e.pool.Close()
	if err := Setup(ctx, e.pool); err != nil {
		return nil, err
	}
	_ = e.pool.QueryRow(ctx, `SHOW server_version`).Scan(&rep.Postgres)

	workload := func(n int) Workload { return Workload{Messages: n, DupEvery: opts.DupEvery, DupLag: opts.DupLag} }
	rep.Crash = workload(opts.CrashMessages)
	for _, s := range Systems() {
		if !selected(s.Name, opts.Only) {
			continue
		}
		r := &Result{System: s, Throughput: workload(opts.PeerMessages)}
		if s.Library || s.Batched {
			r.Throughput = workload(opts.Messages)
		}
		rep.Results = append(rep.Results, r)
	}
	for run := 1; run <= opts.Runs; run++ {
		for i, r := range rep.Results {
			rate, eff, err := e.throughput(ctx, r, fmt.Sprintf("t%d-%d", run, i))
			if err != nil {
				return nil, fmt.Errorf("%s, throughput run %d: %w", r.System.Name, run, err)
			}
			r.Rates = append(r.Rates, rate)
			r.NoCrash = Effects{Double: max(r.NoCrash.Double, eff.Double), Lost: max(r.NoCrash.Lost, eff.Lost)}
			fmt.Fprintf(opts.Log, "run %d: %-66s %9.0f records/s, %d double, %d lost\n", run, r.System.Name, rate, eff.Double, eff.Lost)
		}
	}
	for i, r := range rep.Results {
		slices.Sort(r.Rates)
		r.Rate = r.Rates[len(r.Rates)/2]
		if err := e.crash(ctx, r, rep.Crash, fmt.Sprintf("c-%d", i)); err != nil {
			return nil, fmt.Errorf("%s, crash run: %w", r.System.Name, err)
		}
		fmt.Fprintf(opts.Log, "crash: %-66s kill -9 at record %d: %d double, %d lost\n", r.System.Name, r.CrashAt, r.Crash.Double, r.Crash.Lost)
	}
	return rep, nil
}

func selected(name string, only []string) bool {
	if len(only) == 0 {
		return true
	}
	for _, o := range only {
		if strings.Contains(name, o) {
			return true
		}
	}
	return false
}

// topic returns the topic holding w, producing it on first use.
func (e *env) topic(ctx context.Context, w Workload) (topic, error) {
	if t, ok := e.topics[w]; ok {
		return t, nil
	}
	t := topic{name: fmt.Sprintf("ledger-%d-%d-%d", w.Messages, w.DupEvery, w.DupLag)}
	ends, err := w.Produce(ctx, e.brokers, t.name)
	if err != nil {
		return t, err
	}
	t.ends = ends
	e.topics[w] = t
	return t, nil
}

func (e *env) spec(r *Result, t topic, group string) Spec {
	return Spec{System: r.System.Name, Brokers: e.brokers, Topic: t.name, Group: group, DB: e.url,
		SessionTimeout: e.opts.SessionTimeout}
}

// throughput runs r's system over its workload once, from an empty
// ledger, and returns its rate in records per second and its effects.
func (e *env) throughput(ctx context.Context, r *Result, group string) (float64, Effects, error) {
	t, err := e.topic(ctx, r.Throughput)
	if err != nil {
		return 0, Effects{}, err
	}
	if err := Reset(ctx, e.pool); err != nil {
		return 0, Effects{}, err
	}
	spec := e.spec(r, t, group)
	spec.Expect = r.Throughput.Records()
	p, err := startWorker(spec)
	if err != nil {
		return 0, Effects{}, err
	}
	if err := p.wait(e.opts.WorkerTimeout); err != nil {
		return 0, Effects{}, p.failure(err)
	}
	rep, err := p.report()
	if err != nil {
		return 0, Effects{}, err
	}
	eff, err := Count(ctx, e.pool, r.Throughput)
	return float64(rep.Settled) / rep.Elapsed.Seconds(), eff, err
}

// crash runs r's system over w with a consumer that kills itself after the
// commit of a third of the records and before acknowledging them, and then
// a fresh consumer in the same group until the group's committed offsets
// reach the end of every partition.
func (e *env) crash(ctx context.Context, r *Result, w Workload, group string) error {
	t, err := e.topic(ctx, w)
	if err != nil {
		return err
	}
	if err := Reset(ctx, e.pool); err != nil {
		return err
	}
	spec := e.spec(r, t, group)
	spec.CrashAt = max(1, w.Records()/3)
	r.CrashAt = spec.CrashAt
	first, err := startWorker(spec)
	if err != nil {
		return err
	}
	if err := first.wait(e.opts.WorkerTimeout); !first.killed() {
		return fmt.Errorf("the first consumer was to kill itself at record %d, but exited with %v; its stderr:\n%s",
			spec.CrashAt, err, first.stderr.String())
	}
	spec.CrashAt = 0
	second, err := startWorker(spec)
	if err != nil {
		return err
	}
	client := &kafkago.Client{Addr: kafkago.TCP(e.brokers...), Timeout: 10 * time.Second}
	wctx, cancel := context.WithTimeout(ctx, e.opts.WorkerTimeout)
	defer cancel()
	err = waitUntil(wctx, second, func(ctx context.Context) (bool, error) {
		committed, err := client.ConsumerOffsets(ctx, kafkago.TopicAndGroup{Topic: t.name, GroupId: group})
		if err != nil {
			return false, nil // the group may not exist yet
		}
		for p, end := range t.ends {
			if committed[int(p)] < end {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		_ = second.stop(time.Second)
		return err
	}
	if err := second.stop(30 * time.Second); err != nil {
		return second.failure(err)
	}
	r.Crash, err = Count(ctx, e.pool, w)
	return err
}
