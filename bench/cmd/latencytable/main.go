// Command latencytable measures the Kafka path's end-to-end latency: a
// franz-go producer sends at a fixed rate to an in-process Kafka (kfake,
// 4 partitions), each record carrying the time it was due; the consumer
// (sources/kafka, idset, BatchSize 500, a BatchHandler or a QueueHandler
// writing one ledger row per message) commits them to PostgreSQL; each
// message's latency is its batch's COMMIT less its due time. The schedule
// is open-loop, so a consumer that falls behind shows as latency rather
// than as a slower producer.
//
// It prints, per handler shape and offered rate, the achieved rate, the
// p50, p99 and maximum latency, and whether the rate was sustained; with
// -search, each shape's highest sustained rate (doubling, then bisecting)
// and p50/p99 at 1,000 and 20,000 messages a second, half that rate and
// that rate.
//
//	go run ./bench/cmd/latencytable [-duration 10s] [-rates 1000,20000] [-search] [-runs 1] [-shapes batch,queue] [-pipeline] [-cpuprofile f] [-memprofile f]
//
// It starts a throwaway PostgreSQL with fsync on (as production runs) unless
// DATABASE_URL names a database to use; that database's ledger and
// effectively tables are emptied. KAFKA_BROKERS, when set, names a Kafka
// cluster to use instead of the in-process one.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/effectively-once/effectively/bench"
	"github.com/effectively-once/effectively/internal/kafkatest"
)

func main() {
	duration := flag.Duration("duration", 10*time.Second, "measured window of each run, after the warm-up")
	warmup := flag.Duration("warmup", 2*time.Second, "time each run produces before its window")
	rates := flag.String("rates", "", "comma-separated offered rates in msgs/s (default 1000,20000 without -search, none with it)")
	search := flag.Bool("search", false, "find each shape's highest sustained rate and report latency at 1k, 20k, half of it and it")
	pipeline := flag.Bool("pipeline", false, "kafka.Config.Pipeline, with two consumer goroutines a partition")
	runs := flag.Int("runs", 1, "runs per reported point; the median of each column is reported")
	shapes := flag.String("shapes", "batch,queue", "comma-separated handler shapes: batch, queue, handler, and raw (a hand-written consumer: fetch ahead, insert, COMMIT; no dedupe, no offsets, no engine)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (producer, broker and consumer share the process) to this file")
	memProfile := flag.String("memprofile", "", "write an allocation profile of the whole run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "latencytable:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "latencytable:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		defer func() {
			f, err := os.Create(*memProfile)
			if err == nil {
				_ = pprof.Lookup("allocs").WriteTo(f, 0)
				_ = f.Close()
			}
		}()
	}
	opts := bench.LatencyOptions{Duration: *duration, Warmup: *warmup, Search: *search, Runs: *runs, Pipeline: *pipeline}
	if err := parse(&opts, *rates, *shapes); err != nil {
		fmt.Fprintln(os.Stderr, "latencytable:", err)
		os.Exit(2)
	}
	if err := run(opts); err != nil {
		fmt.Fprintln(os.Stderr, "latencytable:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func parse(opts *bench.LatencyOptions, rates, shapes string) error {
	for _, s := range strings.Split(rates, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		r, err := strconv.ParseFloat(s, 64)
		if err != nil || r <= 0 {
			return fmt.Errorf("-rates: %q is not a positive number of messages per second", s)
		}
		opts.Rates = append(opts.Rates, r)
	}
	names := map[string]bench.Shape{"batch": bench.ShapeBatch, "queue": bench.ShapeQueue, "handler": bench.ShapeHandler, "raw": bench.ShapeRaw}
	for _, s := range strings.Split(shapes, ",") {
		sh, ok := names[strings.ToLower(strings.TrimSpace(s))]
		if !ok {
			return fmt.Errorf("-shapes: %q is not one of batch, queue, handler, raw", s)
		}
		opts.Shapes = append(opts.Shapes, sh)
	}
	if opts.Runs < 1 || opts.Duration <= 0 || opts.Warmup <= 0 {
		return fmt.Errorf("-runs must be at least 1 and -duration and -warmup positive (got %d, %s, %s)", opts.Runs, opts.Duration, opts.Warmup)
	}
	return nil
}

func run(opts bench.LatencyOptions) error {
	ctx := context.Background()
	url, _, stop, err := bench.Database(ctx)
	if err != nil {
		return err
	}
	defer stop()
	k, err := kafkatest.Start() // KAFKA_BROKERS, or the in-process kfake
	if err != nil {
		return err
	}
	defer k.Close()
	return bench.LatencyTable(ctx, url, k, opts, os.Stdout, os.Stderr)
}
