package bench

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// LanesOptions configures LanesTable.
type LanesOptions struct {
	// Lanes are the concurrencies measured. Defaults to 1, 2, 4, 8.
	Lanes []int
	// Batch is the batch size. Defaults to 500.
	Batch int
	// Messages is the number of messages per run. Defaults to 40,000.
	Messages int
	// Runs is the number of runs per row; the median is reported.
	// Defaults to 3.
	Runs int
	// SynchronousCommit lists the synchronous_commit settings measured,
	// each on its own pools. Defaults to "on".
	SynchronousCommit []string
	// ExtraConns is how many connections each pool has beyond the lanes.
	// Defaults to 2.
	ExtraConns int
	// SampleEvery is how often pg_stat_activity is sampled during a run.
	// Defaults to 20 ms.
	SampleEvery time.Duration
}

func (o *LanesOptions) defaults() {
	if len(o.Lanes) == 0 {
		o.Lanes = []int{1, 2, 4, 8}
	}
	if o.Batch == 0 {
		o.Batch = 500
	}
	if o.Messages == 0 {
		o.Messages = 40000
	}
	if o.Runs == 0 {
		o.Runs = 3
	}
	if len(o.SynchronousCommit) == 0 {
		o.SynchronousCommit = []string{"on"}
	}
	if o.ExtraConns == 0 {
		o.ExtraConns = 2
	}
	if o.SampleEvery == 0 {
		o.SampleEvery = 20 * time.Millisecond
	}
}

// rawRow is the name of the raw rows in LanesTable.
const rawRow = "raw: unnest markers + effects"

type lanesResult struct {
	lanes   int
	commit  string
	variant string
	runs    []lanesRun
}

type lanesRun struct {
	rate  float64
	use   Usage
	waits Waits
}

// median returns the run of median rate.
func (r *lanesResult) median() lanesRun {
	runs := slices.Clone(r.runs)
	slices.SortFunc(runs, func(a, b lanesRun) int {
		switch {
		case a.rate < b.rate:
			return -1
		case a.rate > b.rate:
			return 1
		}
		return 0
	})
	return runs[len(runs)/2]
}

// LanesTable measures each handler shape and raw batched SQL at each of
// opts.Lanes concurrencies against the database url names (whose ledger
// and effectively tables it empties), with a pool of lanes + ExtraConns
// connections, and writes Markdown tables to out and progress to log. Runs
// are interleaved, so that the machine's changing load falls on every row
// alike.
func LanesTable(ctx context.Context, url string, opts LanesOptions, out, log io.Writer) error {
	opts.defaults()
	probe, err := NewProbe(ctx, url)
	if err != nil {
		return err
	}
	defer probe.Close(ctx)
	setup, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	err = Setup(ctx, setup)
	setup.Close()
	if err != nil {
		return err
	}
	var results []*lanesResult
	for _, lanes := range opts.Lanes {
		for _, commit := range opts.SynchronousCommit {
			for _, s := range Shapes {
				results = append(results, &lanesResult{lanes: lanes, commit: commit, variant: "engine, " + s.String()})
			}
			results = append(results, &lanesResult{lanes: lanes, commit: commit, variant: rawRow})
		}
	}
	for run := 1; run <= opts.Runs; run++ {
		for _, r := range results {
			lr, err := lanesOnce(ctx, url, probe, opts, r)
			if err != nil {
				return fmt.Errorf("%s, %d lanes, synchronous_commit=%s: %w", r.variant, r.lanes, r.commit, err)
			}
			r.runs = append(r.runs, lr)
			fmt.Fprintf(log, "run %d: %d lanes, sc=%s, %-32s %9.0f msgs/s  Go %5.1f µs/msg  PG %5.1f µs/msg  idle %3.0f%%\n",
				run, r.lanes, r.commit, r.variant, lr.rate, perMsg(lr.use.GoCPU, opts.Messages), perMsg(lr.use.PgCPU, opts.Messages), 100*lr.use.Idle)
		}
	}
	var version string
	if err := probe.conn.QueryRow(ctx, `SHOW server_version`).Scan(&version); err != nil {
		return err
	}
	fmt.Fprintf(out, "PostgreSQL %s, fsync on, %d CPUs, %s; batch %d, %d messages per run, median of %d runs; pool of lanes + %d connections.\n",
		version, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), opts.Batch, opts.Messages, opts.Runs, opts.ExtraConns)
	for _, commit := range opts.SynchronousCommit {
		writeLanesTable(out, opts, results, commit)
	}
	if len(opts.SynchronousCommit) > 1 {
		writeCommitTable(out, opts, results)
	}
	return nil
}

func perMsg(d time.Duration, n int) float64 { return float64(d.Microseconds()) / float64(n) }

func find(results []*lanesResult, lanes int, commit, variant string) *lanesResult {
	for _, r := range results {
		if r.lanes == lanes && r.commit == commit && r.variant == variant {
			return r
		}
	}
	return nil
}

func writeLanesTable(out io.Writer, opts LanesOptions, results []*lanesResult, commit string) {
	fmt.Fprintf(out, "\nsynchronous_commit=%s. CPU columns are CPU time per message (this process; the server's processes); busy is (Go + server CPU) / wall in cores, and per core is msgs/s / busy, the rate per core of CPU the run got (on a shared machine, steadier than msgs/s); others is the cores the machine's other processes used meanwhile; idle is the machine's idle share; syncs is WAL fsyncs per batch (pg_stat_wal.wal_sync), sync is fsync time / wall; waits are sampled from pg_stat_activity, share of non-idle backend samples.\n\n", commit)
	fmt.Fprintln(out, "| lanes | variant | msgs/s | × 1 lane | % of raw | Go µs/msg | PG µs/msg | busy | per core | others | idle | syncs/batch | sync | top waits |")
	fmt.Fprintln(out, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	for _, r := range results {
		if r.commit != commit {
			continue
		}
		m := r.median()
		one := find(results, opts.Lanes[0], commit, r.variant).median()
		raw := find(results, r.lanes, commit, rawRow).median()
		elapsed := time.Duration(float64(opts.Messages) / m.rate * float64(time.Second))
		busy := (m.use.GoCPU + m.use.PgCPU).Seconds() / elapsed.Seconds()
		pg := fmt.Sprintf("%.1f", perMsg(m.use.PgCPU, opts.Messages))
		if !m.use.PgKnown {
			pg = "n/a"
		}
		batches := float64(opts.Messages) / float64(opts.Batch)
		fmt.Fprintf(out, "| %d | %s | %.0f | %.2f× | %.0f%% | %.1f | %s | %.2f | %.0f | %.2f | %.0f%% | %.2f | %.0f%% | %s |\n",
			r.lanes, r.variant, m.rate, m.rate/one.rate, 100*m.rate/raw.rate,
			perMsg(m.use.GoCPU, opts.Messages), pg, busy, m.rate/busy, max(0, (1-m.use.Idle)*float64(runtime.NumCPU())-busy), 100*m.use.Idle,
			float64(m.use.WALSyncs)/batches, m.use.WALSyncMS/10/elapsed.Seconds(),
			strings.Join(m.waits.Top(3), ", "))
	}
}

func writeCommitTable(out io.Writer, opts LanesOptions, results []*lanesResult) {
	on, off := opts.SynchronousCommit[0], opts.SynchronousCommit[1]
	fmt.Fprintf(out, "\nsynchronous_commit=%s against %s, same run.\n\n", off, on)
	fmt.Fprintf(out, "| lanes | variant | msgs/s (%s) | msgs/s (%s) | %s / %s |\n|---:|---|---:|---:|---:|\n", on, off, off, on)
	for _, r := range results {
		if r.commit != on {
			continue
		}
		a, b := r.median(), find(results, r.lanes, off, r.variant).median()
		fmt.Fprintf(out, "| %d | %s | %.0f | %.0f | %.2f× |\n", r.lanes, r.variant, a.rate, b.rate, b.rate/a.rate)
	}
}

// lanesOnce runs r's variant once on a fresh pool.
func lanesOnce(ctx context.Context, url string, probe *Probe, opts LanesOptions, r *lanesResult) (lanesRun, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return lanesRun{}, err
	}
	cfg.MaxConns = int32(r.lanes + opts.ExtraConns)
	cfg.MinConns = cfg.MaxConns
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = r.commit
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return lanesRun{}, err
	}
	defer pool.Close()
	if err := Reset(ctx, pool); err != nil {
		return lanesRun{}, err
	}
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return lanesRun{}, err
	}
	if err := warm(ctx, pool); err != nil {
		return lanesRun{}, err
	}
	var run func() (time.Duration, error)
	if r.variant == rawRow {
		run = func() (time.Duration, error) { return RawLanes(ctx, pool, opts.Messages, opts.Batch, r.lanes) }
	} else {
		s := Shapes[slices.IndexFunc(Shapes, func(s Shape) bool { return "engine, "+s.String() == r.variant })]
		p, err := PrepareEngine(pool, opts.Messages, opts.Batch, r.lanes, s)
		if err != nil {
			return lanesRun{}, err
		}
		run = func() (time.Duration, error) { return p.Run(ctx) }
	}
	var elapsed time.Duration
	use, waits, err := probe.Measure(ctx, opts.SampleEvery,
		func() (err error) { elapsed, err = run(); return err },
		func() error { return probe.EndConns(ctx, pool.Reset) })
	if err != nil {
		return lanesRun{}, err
	}
	return lanesRun{rate: float64(opts.Messages) / elapsed.Seconds(), use: use, waits: waits}, nil
}

// warm opens every connection of pool before a run, so that no run pays
// for connecting.
func warm(ctx context.Context, pool *pgxpool.Pool) error {
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}
