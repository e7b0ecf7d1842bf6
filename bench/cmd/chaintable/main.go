// Command chaintable runs the two-stage chain benchmark of package bench
// side by side with stage A alone, on one PostgreSQL and the in-process
// Kafka (kfake), and prints BENCHMARKS.md's row: Kafka → stage A (a
// BatchHandler with one emit per message) → the log relay → Kafka →
// stage B (a BatchHandler), against stage A alone (the same BatchHandler
// without emits, no relay) on the same inputs.
//
//	go run ./bench/cmd/chaintable [-n 40000] [-runs 3] [-cpuprofile chain.pprof]
//
// With -cpuprofile, the chain runs (not stage A alone) are profiled: the
// library's and the Kafka client's share of this process's CPU; the
// server's share is in PostgreSQL's own processes.
//
// It starts a throwaway PostgreSQL with fsync on (as production runs) unless
// DATABASE_URL names a database to use; that database's ledger, ledger_b
// and effectively tables are emptied.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/effectively-once/effectively/bench"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	n := flag.Int("n", 40000, "inputs per run")
	runs := flag.Int("runs", 3, "runs of each side; the median ratio is reported")
	profile := flag.String("cpuprofile", "", "write a CPU profile of the chain runs to this file")
	flag.Parse()
	if err := run(*n, *runs, *profile); err != nil {
		fmt.Fprintln(os.Stderr, "chaintable:", err)
		os.Exit(1)
	}
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[len(xs)/2]
}

func run(n, runs int, profile string) error {
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
	ob, err := bench.SetupOutbox(ctx, pool)
	if err != nil {
		return err
	}
	if err := bench.SetupChain(ctx, pool); err != nil {
		return err
	}
	var version string
	_ = pool.QueryRow(ctx, `SHOW server_version`).Scan(&version)
	k, err := kafkatest.Start() // KAFKA_BROKERS, or the in-process kfake
	if err != nil {
		return err
	}
	defer k.Close()

	var prof *os.File
	if profile != "" {
		if prof, err = os.Create(profile); err != nil {
			return err
		}
		defer prof.Close()
	}
	reset := func() error {
		if err := bench.ResetOutbox(ctx, pool); err != nil {
			return err
		}
		return bench.SetupChain(ctx, pool)
	}
	probe, err := bench.NewProbe(ctx, url)
	if err != nil {
		return err
	}
	defer func() { _ = probe.Close(ctx) }()
	// measure runs f, sampling the server's backends' wait events.
	measure := func(name string, f func() error) (bench.Waits, error) {
		u, w, err := probe.Measure(ctx, 10*time.Millisecond, f, func() error { return nil })
		if err == nil {
			fmt.Fprintf(os.Stderr, "%s: wall %s, this process's CPU %s, the server's %s (known %v), machine idle %.0f%%\n",
				name, u.Wall.Round(time.Millisecond), u.GoCPU.Round(time.Millisecond), u.PgCPU.Round(time.Millisecond), u.PgKnown, 100*u.Idle)
		}
		return w, err
	}
	// Runs interleaved, so the machine's changing load falls on all sides
	// alike; each ratio is the median of the runs' ratios. Stage A with
	// emits and no relay says what the emits cost, the chain beside it
	// what the relay and stage B cost on top.
	var alone, emit, chain, ratio, emitRatio []float64
	var waitsAlone, waitsEmit, waitsChain bench.Waits
	for r := 1; r <= runs; r++ {
		topic, err := bench.ProduceInputs(ctx, k, n)
		if err != nil {
			return err
		}
		if err := reset(); err != nil {
			return err
		}
		var a, e, c bench.ChainResult
		if waitsAlone, err = measure("stage A alone", func() (err error) { a, err = bench.StageAlone(ctx, pool, nil, k, topic, n); return }); err != nil {
			return err
		}
		if err := reset(); err != nil {
			return err
		}
		if waitsEmit, err = measure("stage A with emits", func() (err error) { e, err = bench.StageAlone(ctx, pool, ob, k, topic, n); return }); err != nil {
			return fmt.Errorf("stage A with emits: %w", err)
		}
		if err := reset(); err != nil {
			return err
		}
		if prof != nil && r == 1 {
			if err := pprof.StartCPUProfile(prof); err != nil {
				return err
			}
		}
		waitsChain, err = measure("chain", func() (err error) { c, err = bench.Chain(ctx, pool, ob, k, topic, n); return })
		if prof != nil && r == 1 {
			pprof.StopCPUProfile()
		}
		if err != nil {
			return err
		}
		alone, emit, chain = append(alone, a.Rate()), append(emit, e.Rate()), append(chain, c.Rate())
		ratio, emitRatio = append(ratio, c.Rate()/a.Rate()), append(emitRatio, e.Rate()/a.Rate())
		fmt.Fprintf(os.Stderr, "run %d: stage A alone %.0f msgs/s (%s), with emits %.0f msgs/s (%s), chain %.0f msgs/s (%s; stage A done after %s; relay published %d, %d reconnects)\n",
			r, a.Rate(), a.Elapsed.Round(time.Millisecond), e.Rate(), e.Elapsed.Round(time.Millisecond), c.Rate(), c.Elapsed.Round(time.Millisecond),
			c.StageA.Round(time.Millisecond), c.Relay.Published, c.Relay.Reconnects)
	}
	cr := median(ratio)
	fmt.Printf("PostgreSQL %s, fsync on, Kafka: kfake in-process, %d CPUs, %s; medians of %d interleaved runs, %d partitions per topic.\n\n",
		version, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), runs, bench.ChainPartitions)
	fmt.Println("| benchmark | messages | result | beside it | ratio | target |")
	fmt.Println("|---|---:|---:|---:|---:|---|")
	mark := "(MISSED)"
	if cr >= 0.6 {
		mark = "(met)"
	}
	fmt.Printf("| two-stage chain: Kafka → stage A (BatchHandler, batch 500, one emit per message) → log relay → Kafka → stage B (BatchHandler), against stage A alone (no emits, no relay) | %d | %.0f msgs/s | %.0f msgs/s | %.0f%% | ≥ 60%% %s |\n",
		n, median(chain), median(alone), 100*cr, mark)
	er := median(emitRatio)
	fmt.Printf("| stage A with one emit per message, no relay, against stage A alone (what the emits cost the chain) | %d | %.0f msgs/s | %.0f msgs/s | %.0f%% | — |\n",
		n, median(emit), median(alone), 100*er)
	fmt.Println()
	fmt.Println("Where the server's backends spent the last run (samples of non-idle backends, pg_stat_activity every 10 ms):")
	fmt.Println()
	fmt.Println("| run | top wait events |")
	fmt.Println("|---|---|")
	for _, w := range []struct {
		name string
		w    bench.Waits
	}{{"stage A alone", waitsAlone}, {"stage A with emits", waitsEmit}, {"chain", waitsChain}} {
		fmt.Printf("| %s | %s |\n", w.name, strings.Join(w.w.Top(5), ", "))
	}
	return nil
}
