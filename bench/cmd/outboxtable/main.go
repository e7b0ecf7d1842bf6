// Command outboxtable runs the outbox's benchmarks of package bench side
// by side on one PostgreSQL and the in-process Kafka (kfake), and prints
// BENCHMARKS.md's table: the engine's BatchHandler and QueueHandler with
// one emit per message against the same handler without, for an outbox in
// LogMode (one INSERT per batch) and in TableMode (the per-key counter the
// table-polling relay orders by); the relay against a plain kafka-go
// Writer writing the same messages to the same topic, and commit-to-publish
// latency with NOTIFY, with polling only and with the log relay, idle and
// under load; the log relay (logical replication) against the same Writer.
//
//	go run ./bench/cmd/outboxtable [-scale 1] [-runs 3] [-emit-only]
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
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/outbox"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	scale := flag.Float64("scale", 1, "multiply the number of messages per run")
	runs := flag.Int("runs", 3, "runs per throughput variant; the median is reported")
	probes := flag.Int("probes", 200, "latency probes per latency row")
	emitOnly := flag.Bool("emit-only", false, "run the emit rows only")
	flag.Parse()
	if err := run(*scale, *runs, *probes, *emitOnly); err != nil {
		fmt.Fprintln(os.Stderr, "outboxtable:", err)
		os.Exit(1)
	}
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[len(xs)/2]
}

func run(scale float64, runs, probes int, emitOnly bool) error {
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
	var version string
	_ = pool.QueryRow(ctx, `SHOW server_version`).Scan(&version)
	k, err := kafkatest.Start() // KAFKA_BROKERS, or the in-process kfake
	if err != nil {
		return err
	}
	defer k.Close()
	topic := kafkatest.Name("outbox-bench")
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		return err
	}

	obLog, err := bench.OutboxMode(outbox.LogMode)
	if err != nil {
		return err
	}

	// (a) and (b): runs interleaved, so the machine's changing load falls
	// on both sides alike; each ratio is the median of the runs' ratios.
	nEmit, nRelay := int(40000*scale), int(50000*scale)
	type engine = func(ctx context.Context, pool *pgxpool.Pool, n, batch int) (time.Duration, error)
	emits := []*emitRow{
		{name: "BatchHandler (batch 500) + one Emit per message (LogMode), against without", plain: bench.Engine(true), emit: bench.EngineEmit(obLog), target: 0.8},
		{name: "QueueHandler (batch 500) + one EmitQueued per message (LogMode), against without", plain: bench.EngineQueue, emit: bench.EngineQueueEmit(obLog), target: 0.8},
		{name: "BatchHandler (batch 500) + one Emit per message (TableMode: per-key counter and NOTIFY), against without", plain: bench.Engine(true), emit: bench.EngineEmit(ob)},
		{name: "QueueHandler (batch 500) + one EmitQueued per message (TableMode), against without", plain: bench.EngineQueue, emit: bench.EngineQueueEmit(ob)},
	}
	timed := func(e engine) (float64, error) {
		if err := bench.ResetOutbox(ctx, pool); err != nil {
			return 0, err
		}
		d, err := e(ctx, pool, nEmit, 500)
		return float64(nEmit) / d.Seconds(), err
	}
	var relay, relayDel, logRelay, writer, relayRatio, relayDelRatio, logRatio []float64
	for r := 1; r <= runs; r++ {
		for _, e := range emits {
			p, err := timed(e.plain)
			if err != nil {
				return fmt.Errorf("%s: without: %w", e.name, err)
			}
			w, err := timed(e.emit)
			if err != nil {
				return fmt.Errorf("%s: %w", e.name, err)
			}
			e.plains, e.emits, e.ratios = append(e.plains, p), append(e.emits, w), append(e.ratios, w/p)
			fmt.Fprintf(os.Stderr, "run %d: %s: %.0f against %.0f msgs/s (%.0f%%)\n", r, e.name, w, p, 100*w/p)
		}
		if emitOnly {
			continue
		}
		if err := bench.ResetOutbox(ctx, pool); err != nil {
			return err
		}
		d, err := bench.RelayThroughput(ctx, pool, ob, k, topic, nRelay, 0)
		if err != nil {
			return fmt.Errorf("relay: %w", err)
		}
		relay = append(relay, float64(nRelay)/d.Seconds())
		if d, err = bench.WriterThroughput(ctx, k, topic, nRelay); err != nil {
			return fmt.Errorf("writer: %w", err)
		}
		writer = append(writer, float64(nRelay)/d.Seconds())
		if err := bench.ResetOutbox(ctx, pool); err != nil {
			return err
		}
		if d, err = bench.RelayThroughput(ctx, pool, ob, k, topic, nRelay, outbox.DeleteOnPublish); err != nil {
			return fmt.Errorf("relay (DeleteOnPublish): %w", err)
		}
		relayDel = append(relayDel, float64(nRelay)/d.Seconds())
		if err := bench.ResetOutbox(ctx, pool); err != nil {
			return err
		}
		if d, err = bench.LogRelayThroughput(ctx, pool, obLog, k, topic, nRelay); err != nil {
			return fmt.Errorf("log relay: %w", err)
		}
		logRelay = append(logRelay, float64(nRelay)/d.Seconds())
		logRatio = append(logRatio, logRelay[r-1]/writer[r-1])
		relayRatio = append(relayRatio, relay[r-1]/writer[r-1])
		relayDelRatio = append(relayDelRatio, relayDel[r-1]/writer[r-1])
		fmt.Fprintf(os.Stderr, "run %d: relay %.0f, relay (DeleteOnPublish) %.0f, log relay %.0f, Writer %.0f msgs/s\n",
			r, relay[r-1], relayDel[r-1], logRelay[r-1], writer[r-1])
	}
	if emitOnly {
		printHeader(version, runs)
		printEmits(emits, nEmit)
		return nil
	}

	// (c)
	type latRow struct {
		name           string
		load, pollOnly bool
		log            bool          // the log relay
		linger         time.Duration // the Writer's BatchTimeout, when not the default
		l              bench.Latency
		err            error
	}
	lats := []*latRow{
		{name: "NOTIFY, idle"}, {name: "NOTIFY, under load", load: true},
		{name: "polling only (1 s), idle", pollOnly: true}, {name: "polling only (1 s), under load", load: true, pollOnly: true},
		{name: "log relay, idle", log: true}, {name: "log relay, under load", load: true, log: true},
		{name: "log relay, idle, Writer BatchTimeout 1 ms", log: true, linger: time.Millisecond},
		{name: "log relay, under load, Writer BatchTimeout 1 ms", load: true, log: true, linger: time.Millisecond},
	}
	for _, l := range lats {
		if err := bench.ResetOutbox(ctx, pool); err != nil {
			return err
		}
		// A row that fails is reported as failed, in the table.
		if l.log {
			l.l, l.err = bench.LogCommitToPublish(ctx, pool, obLog, k, topic, probes, l.load, l.linger)
		} else {
			l.l, l.err = bench.CommitToPublish(ctx, pool, ob, k, topic, probes, l.load, l.pollOnly)
		}
		fmt.Fprintf(os.Stderr, "latency %s: p50 %s p99 %s err %v\n", l.name, l.l.P50, l.l.P99, l.err)
	}

	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	printHeader(version, runs)
	printEmits(emits, nEmit)
	rr := median(relayRatio)
	fmt.Printf("| relay → Kafka (published rows kept for the Retention), against a plain kafka-go Writer, same messages and topic | %d | %.0f msgs/s | %.0f msgs/s | %.0f%% | ≥ 70%% %s |\n",
		nRelay, median(relay), median(writer), 100*rr, mark(rr >= 0.7))
	rd := median(relayDelRatio)
	fmt.Printf("| relay → Kafka, Retention: DeleteOnPublish, against the same Writer | %d | %.0f msgs/s | %.0f msgs/s | %.0f%% | ≥ 70%% %s |\n",
		nRelay, median(relayDel), median(writer), 100*rd, mark(rd >= 0.7))
	lr := median(logRatio)
	fmt.Printf("| log relay (logical replication) → Kafka, against the same Writer | %d | %.0f msgs/s | %.0f msgs/s | %.0f%% | ≥ 80%% %s |\n",
		nRelay, median(logRelay), median(writer), 100*lr, mark(lr >= 0.8))
	fmt.Println()
	fmt.Println("| commit-to-publish latency | probes | p50 | p99 | load (msgs emitted meanwhile) | target |")
	fmt.Println("|---|---:|---:|---:|---:|---|")
	for _, l := range lats {
		target := "—"
		switch {
		case l.log && l.load:
			target = "p50 ≤ 5 ms, p99 ≤ 20 ms " + mark(l.l.P50 <= 5*time.Millisecond && l.l.P99 <= 20*time.Millisecond)
		case l.log:
			target = "p50 ≤ 5 ms " + mark(l.l.P50 <= 5*time.Millisecond)
		case !l.pollOnly:
			target = "p50 < 50 ms " + mark(l.l.P50 < 50*time.Millisecond)
		}
		if l.err != nil {
			fmt.Printf("| %s | — | failed: %v | | | %s |\n", l.name, l.err, mark(false))
			continue
		}
		fmt.Printf("| %s | %d | %s | %s | %d | %s |\n", l.name, l.l.Samples, ms(l.l.P50), ms(l.l.P99), l.l.Load, target)
	}
	return nil
}

// emitRow is one emit benchmark: a handler with emits against the same
// without, and what each run measured.
type emitRow struct {
	name                  string
	plain, emit           func(ctx context.Context, pool *pgxpool.Pool, n, batch int) (time.Duration, error)
	target                float64 // 0: none
	plains, emits, ratios []float64
}

func printHeader(version string, runs int) {
	fmt.Printf("PostgreSQL %s, fsync on, Kafka: kfake in-process, %d CPUs, %s; medians of %d interleaved runs.\n\n",
		version, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), runs)
	fmt.Println("| benchmark | messages | result | beside it | ratio | target |")
	fmt.Println("|---|---:|---:|---:|---:|---|")
}

func printEmits(emits []*emitRow, n int) {
	for _, e := range emits {
		r := median(e.ratios)
		target := "—"
		if e.target > 0 {
			target = fmt.Sprintf("≥ %.0f%% %s", 100*e.target, mark(r >= e.target))
		}
		fmt.Printf("| %s | %d | %.0f msgs/s | %.0f msgs/s | %.0f%% | %s |\n", e.name, n, median(e.emits), median(e.plains), 100*r, target)
	}
}

func mark(ok bool) string {
	if ok {
		return "(met)"
	}
	return "(MISSED)"
}
