// Command expirytable runs package bench/expiry: the bloom strategy against
// idset at millions of live markers, side by side on one PostgreSQL, and
// prints a Markdown table of claim throughput, the cost of expiring one
// slice, the throughput while a slice expires, and the filters' memory and
// false-positive rate.
//
//	go run ./bench/cmd/expirytable [-markers 10000000] [-runs 7] [-claim 100000] [-current-keys 1400000]
//
// It starts a throwaway PostgreSQL with fsync on (as production runs) unless
// DATABASE_URL names a database to use; that database's expiry_bench schema
// is dropped and recreated.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/bench"
	"github.com/effectively-once/effectively/bench/expiry"
)

func main() {
	var cfg expiry.Config
	flag.IntVar(&cfg.Markers, "markers", 10_000_000, "live markers loaded into each strategy's table")
	flag.IntVar(&cfg.Slices, "slices", 7, "retention in (daily) slices")
	flag.IntVar(&cfg.Batch, "batch", 500, "new keys per claiming transaction")
	flag.IntVar(&cfg.ClaimKeys, "claim", 100_000, "new keys per strategy per throughput run")
	flag.IntVar(&cfg.CurrentKeys, "current-keys", 0, "keys bloom's filter of the current slice is sized for (default 2 × runs × claim)")
	flag.IntVar(&cfg.Runs, "runs", 7, "interleaved throughput runs; the median is reported")
	flag.DurationVar(&cfg.Steady, "steady", 3*time.Second, "claim time before an expiry starts and after its window (the steady state)")
	flag.Parse()
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "expirytable:", err)
		os.Exit(1)
	}
}

func run(cfg expiry.Config) error {
	ctx := context.Background()
	begin := time.Now()
	cfg.Logf = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%6.1fs  %s\n", time.Since(begin).Seconds(), fmt.Sprintf(format, args...))
	}
	url, _, stop, err := bench.Database(ctx)
	if err != nil {
		return err
	}
	defer stop()
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	pcfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := expiry.Run(ctx, pool, cfg)
	if err != nil {
		return err
	}
	fmt.Printf("%d CPUs, %s, finished in %s.\n", runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), time.Since(begin).Round(time.Second))
	res.Markdown(os.Stdout)
	return nil
}
