package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LatencyOptions configures KafkaLatency and LatencyTable.
type LatencyOptions struct {
	// Shapes are the handler shapes measured. Defaults to BatchHandler
	// and QueueHandler.
	Shapes []Shape
	// Rates are the offered rates measured, in messages per second.
	// Defaults to none when Search is set, else 1,000 and 20,000.
	Rates []float64
	// Search makes LatencyTable look for each shape's highest sustained
	// rate, then measure 1,000 and 20,000 messages a second, half that
	// rate and that rate.
	Search bool
	// Pipeline runs the source with kafka.Config.Pipeline and the consumer
	// with two goroutines a lane, so that a partition's next batch claims
	// while its last one commits.
	Pipeline bool
	// SearchFrom is the rate the search starts doubling from. Defaults to
	// 5,000.
	SearchFrom float64
	// Duration is the measured window of each run. Defaults to 10 s.
	Duration time.Duration
	// Warmup is how long each run produces before its window starts.
	// Defaults to 2 s.
	Warmup time.Duration
	// Drain is how long after the window a run waits for its last
	// messages to commit; those that have not by then count as not
	// committed (and the rate as not sustained). Defaults to the longer
	// of Duration and 10 s.
	Drain time.Duration
	// Runs is the number of runs per reported point; the median of each
	// column is reported. The search's probes run once. Defaults to 1.
	Runs int
}

func (o *LatencyOptions) defaults() {
	if len(o.Shapes) == 0 {
		o.Shapes = []Shape{ShapeBatch, ShapeQueue}
	}
	if len(o.Rates) == 0 && !o.Search {
		o.Rates = []float64{1000, 20000}
	}
	if o.SearchFrom == 0 {
		o.SearchFrom = 5000
	}
	if o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	if o.Warmup == 0 {
		o.Warmup = 2 * time.Second
	}
	if o.Drain == 0 {
		o.Drain = max(o.Duration, 10*time.Second)
	}
	if o.Runs == 0 {
		o.Runs = 1
	}
}

// searchCeiling bounds the search's doubling.
const searchCeiling = 2_000_000

// LatencyTable measures each of opts.Shapes at each of opts.Rates with
// KafkaLatency (runs interleaved, so that the machine's changing load
// falls on every row alike) on the database url names (whose ledger and
// effectively tables it empties) and the cluster k, then, with
// opts.Search, finds each shape's highest sustained rate: doubling from
// SearchFrom until a rate is not sustained, then bisecting until the two
// rates are within 10%. It writes Markdown tables to out and progress to
// log.
func LatencyTable(ctx context.Context, url string, k *kafkatest.Cluster, opts LatencyOptions, out, log io.Writer) error {
	opts.defaults()
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	pcfg.MaxConns = 2*LatencyPartitions + 4 // up to two batches a lane, the source's claims and the checks
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := Setup(ctx, pool); err != nil {
		return err
	}
	var version string
	if err := pool.QueryRow(ctx, `SHOW server_version`).Scan(&version); err != nil {
		return err
	}
	measure := func(s Shape, rate float64, label string) (LatencyResult, error) {
		r, err := KafkaLatency(ctx, pool, k, s, rate, opts)
		if err != nil {
			return r, fmt.Errorf("%s at %.0f msgs/s: %w", s, rate, err)
		}
		fmt.Fprintf(log, "%s%s at %.0f msgs/s: achieved %.0f, p50 %s p99 %s max %s, batch %.0f, to batch start %s, in batch %s (mean claim %s, handle %s, commit %s), lag %d → %d, producer late %s, sustained %v%s\n",
			label, s, rate, r.Achieved, latMS(r.P50), latMS(r.P99), latMS(r.Max), r.Batch, latMS(r.ToStart), latMS(r.InBatch),
			latMS(r.Claim), latMS(r.Handle), latMS(r.Commit),
			r.LagStart, r.LagEnd, latMS(r.ProducerLate), r.Sustained(), otherNote(r))
		fmt.Fprintf(log, "  %s\n", r.Tail)
		return r, nil
	}
	// points measures every shape at every rate of rates(shape), runs
	// times, interleaved, and returns the medians by shape and rate.
	points := func(rates func(Shape) []float64) (map[Shape]map[float64]LatencyResult, error) {
		runs := map[Shape]map[float64][]LatencyResult{}
		for _, s := range opts.Shapes {
			runs[s] = map[float64][]LatencyResult{}
		}
		for run := 1; run <= opts.Runs; run++ {
			for i := 0; ; i++ {
				more := false
				for _, s := range opts.Shapes {
					rs := rates(s)
					if i >= len(rs) {
						continue
					}
					more = true
					r, err := measure(s, rs[i], fmt.Sprintf("run %d/%d: ", run, opts.Runs))
					if err != nil {
						return nil, err
					}
					runs[s][rs[i]] = append(runs[s][rs[i]], r)
				}
				if !more {
					break
				}
			}
		}
		med := map[Shape]map[float64]LatencyResult{}
		for s, byRate := range runs {
			med[s] = map[float64]LatencyResult{}
			for rate, rs := range byRate {
				med[s][rate] = medianLatency(rs)
			}
		}
		return med, nil
	}

	fmt.Fprintf(out, "PostgreSQL %s, fsync on; Kafka: kfake in-process, %d partitions; %d CPUs, %s. Consumer: sources/kafka, idset, BatchSize %d, %d lanes, one ledger row per message. "+
		"Producer: franz-go, open-loop at the offered rate (linger 1 ms); latency = batch COMMIT − scheduled send, of the messages due in a %s window after %s of warm-up; median of %d run(s).\n",
		version, LatencyPartitions, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), LatencyBatch, LatencyPartitions,
		opts.Duration, opts.Warmup, opts.Runs)
	if opts.Pipeline {
		fmt.Fprintf(out, "Pipelined: kafka.Config.Pipeline, %d consumer goroutines.\n", 2*LatencyPartitions)
	}
	if slices.Contains(opts.Shapes, ShapeRaw) {
		fmt.Fprintf(out, "hand-written: no engine, no dedupe claim, no offsets: per partition one goroutine fetching ahead (kafka-go's Client.Fetch) "+
			"and one committing what arrived, up to %d a transaction (processed-ID markers and ledger rows, one unnest statement each).\n", LatencyBatch)
	}
	if len(opts.Rates) > 0 {
		res, err := points(func(Shape) []float64 { return opts.Rates })
		if err != nil {
			return err
		}
		fmt.Fprintln(out, "\nSustained: achieved ≥ 98% of offered, lag not grown by more than 2 batches per lane or 2% of the window, every message committed. To batch start: scheduled send → the batch began (produce, broker, fetch, waiting for the lane); in batch: → COMMIT (claim, handler, commit). Producer late: how far behind its schedule the producer handed over its last record; when large, the producer (or the broker) could not keep the rate, and that shows in the latencies too.")
		fmt.Fprintln(out, "\n| shape | offered msgs/s | achieved msgs/s | p50 | p99 | max | mean batch | to batch start p50 | in batch p50 | lag start → end | producer late | sustained |")
		fmt.Fprintln(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
		for _, s := range opts.Shapes {
			for _, rate := range opts.Rates {
				r := res[s][rate]
				fmt.Fprintf(out, "| %s | %.0f | %.0f | %s | %s | %s | %.0f | %s | %s | %d → %d | %s | %s |\n", s, rate, r.Achieved,
					latMS(r.P50), latMS(r.P99), latMS(r.Max), r.Batch, latMS(r.ToStart), latMS(r.InBatch), r.LagStart, r.LagEnd,
					latMS(r.ProducerLate), yesNo(r.Sustained()))
			}
		}
	}
	if !opts.Search {
		return nil
	}
	best := map[Shape]float64{}
	for _, s := range opts.Shapes {
		rate, err := searchRate(opts.SearchFrom, func(rate float64) (bool, error) {
			r, err := measure(s, rate, "search: ")
			return r.Sustained(), err
		})
		if err != nil {
			return err
		}
		best[s] = rate
		fmt.Fprintf(log, "search: %s sustains %.0f msgs/s\n", s, rate)
	}
	targets := func(s Shape) []float64 {
		if best[s] == 0 {
			return []float64{1000, 20000}
		}
		var ts []float64
		for _, t := range []float64{1000, 20000, roundRate(best[s] / 2), best[s]} {
			if !slices.Contains(ts, t) {
				ts = append(ts, t)
			}
		}
		return ts
	}
	res, err := points(targets)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "\nHighest sustained rate found by doubling then bisecting to within 10% (one run per probe); then each point measured again. Cells are p50 / p99; a point that did not sustain its rate in that measurement is marked (not sustained): near the maximum, a backlog that forms lasts, batches grow to the BatchSize and the wait before a batch dominates.")
	fmt.Fprintln(out, "\n| shape | max sustained msgs/s | 1k msgs/s | 20k msgs/s | ½ max | max |")
	fmt.Fprintln(out, "|---|---:|---:|---:|---:|---:|")
	for _, s := range opts.Shapes {
		cells := []string{s.String(), fmt.Sprintf("%.0f", best[s])}
		columns := []float64{1000, 20000}
		if best[s] > 0 {
			columns = append(columns, roundRate(best[s]/2), best[s])
		}
		for _, rate := range columns {
			r := res[s][rate]
			cell := fmt.Sprintf("%s / %s", latMS(r.P50), latMS(r.P99))
			if len(cells) >= 4 { // ½ max and max: say which rate
				cell = fmt.Sprintf("%.0f: %s", rate, cell)
			}
			if !r.Sustained() {
				cell += " (not sustained)"
			}
			cells = append(cells, cell)
		}
		for len(cells) < 6 {
			cells = append(cells, "—")
		}
		fmt.Fprintf(out, "| %s |\n", strings.Join(cells, " | "))
	}
	return nil
}

// searchRate returns the highest rate that sustained says is sustained:
// from from, doubling while it is, then bisecting between the highest
// rate sustained and the lowest not until they are within 10%. When from
// itself is not sustained, it halves first (down to 100 msgs/s; 0 if not
// even that).
func searchRate(from float64, sustained func(float64) (bool, error)) (float64, error) {
	lo, hi := 0.0, 0.0
	for rate := from; ; {
		ok, err := sustained(rate)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = rate
			if hi > 0 {
				break // halving found a sustained rate below hi
			}
			if rate *= 2; rate > searchCeiling {
				return lo, nil
			}
			continue
		}
		hi = rate
		if lo > 0 {
			break
		}
		if rate = roundRate(rate / 2); rate < 100 {
			return 0, nil
		}
	}
	for hi/lo > 1.1 {
		mid := roundRate((lo + hi) / 2)
		if mid <= lo || mid >= hi {
			break
		}
		ok, err := sustained(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}

// roundRate rounds a rate to two significant digits, so that the tables
// show rates a reader can repeat.
func roundRate(r float64) float64 {
	if r <= 0 {
		return 0
	}
	unit := math.Pow(10, math.Floor(math.Log10(r))-1)
	return math.Round(r/unit) * unit
}

// medianLatency takes each column's median over runs of one shape and rate.
func medianLatency(rs []LatencyResult) LatencyResult {
	m := rs[0]
	m.Achieved = median(rs, func(r LatencyResult) float64 { return r.Achieved })
	m.P50 = median(rs, func(r LatencyResult) time.Duration { return r.P50 })
	m.P99 = median(rs, func(r LatencyResult) time.Duration { return r.P99 })
	m.Max = median(rs, func(r LatencyResult) time.Duration { return r.Max })
	m.ToStart = median(rs, func(r LatencyResult) time.Duration { return r.ToStart })
	m.InBatch = median(rs, func(r LatencyResult) time.Duration { return r.InBatch })
	m.ProducerLate = median(rs, func(r LatencyResult) time.Duration { return r.ProducerLate })
	m.Claim = median(rs, func(r LatencyResult) time.Duration { return r.Claim })
	m.Handle = median(rs, func(r LatencyResult) time.Duration { return r.Handle })
	m.Commit = median(rs, func(r LatencyResult) time.Duration { return r.Commit })
	m.Batch = median(rs, func(r LatencyResult) float64 { return r.Batch })
	m.LagStart = median(rs, func(r LatencyResult) int { return r.LagStart })
	m.LagEnd = median(rs, func(r LatencyResult) int { return r.LagEnd })
	m.NotCommitted = median(rs, func(r LatencyResult) int { return r.NotCommitted })
	m.Other = median(rs, func(r LatencyResult) int { return r.Other })
	return m
}

// median returns the median of f over rs.
func median[T int | float64 | time.Duration](rs []LatencyResult, f func(LatencyResult) T) T {
	v := make([]T, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// latMS formats a latency in milliseconds, or "undrained" for Undrained.
func latMS(d time.Duration) string {
	if d == Undrained {
		return "undrained"
	}
	return fmt.Sprintf("%.1f ms", float64(d)/1e6)
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

func otherNote(r LatencyResult) string {
	if r.Other == 0 {
		return ""
	}
	return fmt.Sprintf(" (%d not applied or rolled back; last: %s)", r.Other, r.OtherErr)
}
