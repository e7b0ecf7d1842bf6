// Command benchtable runs every variant of package bench side by side on one
// PostgreSQL and prints a Markdown table of messages per second, relative
// to the naive consumer and to the raw limit.
//
//	go run ./bench/cmd/benchtable [-scale 1] [-runs 3]
//
// It starts a throwaway PostgreSQL with fsync on (as production runs) unless
// DATABASE_URL names a database to use; that database's ledger and
// effectively tables are emptied.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/effectively-once/effectively/bench"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	scale := flag.Float64("scale", 1, "multiply the number of messages per run")
	runs := flag.Int("runs", 3, "runs per variant; the median is reported")
	flag.Parse()
	if err := run(*scale, *runs); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func run(scale float64, runs int) error {
	ctx := context.Background()
	url, _, stop, err := bench.Database(ctx)
	if err != nil {
		return err
	}
	defer stop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := bench.Setup(ctx, pool); err != nil {
		return err
	}
	var version string
	_ = pool.QueryRow(ctx, `SHOW server_version`).Scan(&version)

	type result struct {
		v     bench.Variant
		n     int
		rates []float64
		rate  float64
	}
	// Runs are interleaved (every variant once, then again) so that the
	// machine's changing load falls on all variants alike.
	var results []*result
	for _, v := range bench.Variants() {
		results = append(results, &result{v: v, n: int(float64(messages(v)) * scale)})
	}
	for run := 1; run <= runs; run++ {
		for _, r := range results {
			if err := bench.Reset(ctx, pool); err != nil {
				return err
			}
			d, err := r.v.Run(ctx, pool, r.n, r.v.Batch)
			if err != nil {
				return fmt.Errorf("%s (batch %d): %w", r.v.Name, r.v.Batch, err)
			}
			r.rates = append(r.rates, float64(r.n)/d.Seconds())
			fmt.Fprintf(os.Stderr, "run %d: %-40s batch %4d: %9.0f msgs/s\n", run, r.v.Name, r.v.Batch, float64(r.n)/d.Seconds())
		}
	}
	for _, r := range results {
		slices.Sort(r.rates)
		r.rate = r.rates[len(r.rates)/2]
	}
	naive, raw := results[0].rate, results[len(results)-1].rate

	fmt.Printf("PostgreSQL %s, fsync on, %d CPUs, %s; median of %d runs, one effect row + one marker per message.\n\n",
		version, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), runs)
	fmt.Println("| variant | batch | messages | msgs/s | × naive | % of raw |")
	fmt.Println("|---|---:|---:|---:|---:|---:|")
	for _, r := range results {
		fmt.Printf("| %s | %d | %d | %.0f | %.1f× | %.0f%% |\n", r.v.Name, r.v.Batch, r.n, r.rate, r.rate/naive, 100*r.rate/raw)
	}
	find := func(name string, batch int) float64 {
		for _, r := range results {
			if r.v.Name == name && r.v.Batch == batch {
				return r.rate
			}
		}
		return 0
	}
	h, qh, bh := find("engine, Handler", 500), find("engine, QueueHandler", 500), find("engine, BatchHandler", 500)
	fmt.Println()
	fmt.Printf("Targets at batch 500: Handler ≥ 8× naive: %.1f× %s; BatchHandler ≥ 25× naive: %.1f× %s; BatchHandler ≥ 70%% of raw: %.0f%% %s\n",
		h/naive, mark(h/naive >= 8), bh/naive, mark(bh/naive >= 25), 100*bh/raw, mark(bh/raw >= 0.7))
	fmt.Printf("QueueHandler ≥ 50× naive: %.1f× %s; QueueHandler ≥ 75%% of raw: %.0f%% %s\n",
		qh/naive, mark(qh/naive >= 50), 100*qh/raw, mark(qh/raw >= 0.75))
	return nil
}

func mark(ok bool) string {
	if ok {
		return "(met)"
	}
	return "(MISSED)"
}

// messages sizes each variant to run for roughly a second or two.
func messages(v bench.Variant) int {
	switch {
	case v.Batch == 1:
		return 2000
	case v.Batch < 500:
		return 20000
	default:
		return 40000
	}
}
