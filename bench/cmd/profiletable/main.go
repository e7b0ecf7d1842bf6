// Command profiletable shows where the engine's time goes against raw SQL,
// per message: it runs raw (two unnest statements per transaction), the
// engine with a BatchHandler and the engine with a QueueHandler, each on
// one lane at batch 500 as `make bench` does, on a throwaway PostgreSQL
// with fsync on and pg_stat_statements loaded, and splits each run's wall
// time into the Go process's CPU time (getrusage: the engine, the
// in-memory broker, pgx, the garbage collector), the server's execution
// time of each statement (pg_stat_statements; a COMMIT's WAL flush happens
// after the statement is counted, so it falls in the rest), and the rest
// (round trips, COMMIT's flush, waiting). The Go process's CPU time
// includes work done in parallel with the server (the collector, the
// broker's goroutines), so the rest can come out below zero, shown as 0.
// Runs are interleaved; the medians are printed as a Markdown table, in
// microseconds per message.
//
//	go run ./bench/cmd/profiletable [-n 40000] [-runs 3]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/effectively-once/effectively/bench"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	n := flag.Int("n", 40000, "messages per run")
	runs := flag.Int("runs", 3, "runs per variant; the median is reported")
	flag.Parse()
	if err := run(*n, *runs); err != nil {
		fmt.Fprintln(os.Stderr, "profiletable:", err)
		os.Exit(1)
	}
}

type variant struct {
	name string
	run  func(ctx context.Context, pool *pgxpool.Pool, n, batch int) (time.Duration, error)
}

// sample is one run, in microseconds per message.
type sample struct {
	wall, cpu float64
	stmts     map[string]float64 // statement kind → server time
	calls     map[string]float64 // statement kind → calls per batch
}

func run(n, runs int) error {
	ctx := context.Background()
	fmt.Fprintln(os.Stderr, "starting a throwaway PostgreSQL (fsync on, pg_stat_statements)…")
	c, err := pgtest.Start(ctx, pgtest.Options{Fsync: true, Settings: []string{
		"shared_preload_libraries=pg_stat_statements",
		"pg_stat_statements.track=all",
		"pg_stat_statements.track_utility=on",
	}})
	if err != nil {
		return err
	}
	defer c.Stop()
	url, err := c.CreateDatabase(ctx, "bench")
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return err
	}
	if err := bench.Setup(ctx, pool); err != nil {
		return err
	}
	var version string
	_ = pool.QueryRow(ctx, `SHOW server_version`).Scan(&version)

	const batch = 500
	variants := []variant{
		{"raw: unnest markers + effects", bench.Raw},
		{"engine, BatchHandler", bench.Engine(true)},
		{"engine, QueueHandler", bench.EngineQueue},
	}
	samples := make([][]sample, len(variants))
	for r := range runs {
		for i, v := range variants {
			if err := bench.Reset(ctx, pool); err != nil {
				return err
			}
			if _, err := pool.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
				return err
			}
			cpu0 := cpuTime()
			elapsed, err := v.run(ctx, pool, n, batch)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			cpu := cpuTime() - cpu0
			s := sample{
				wall: us(elapsed) / float64(n), cpu: us(cpu) / float64(n),
				stmts: map[string]float64{}, calls: map[string]float64{},
			}
			if err := statements(ctx, pool, s, n, batch); err != nil {
				return err
			}
			samples[i] = append(samples[i], s)
			fmt.Fprintf(os.Stderr, "run %d %-32s %6.2f µs/msg wall, %5.2f µs/msg Go CPU\n", r+1, v.name, s.wall, s.cpu)
		}
	}

	fmt.Printf("PostgreSQL %s, fsync on, %d CPUs, %s; %d messages per run, batch %d, one lane; median of %d runs; µs per message.\n\n",
		version, numCPU(), time.Now().Format("2006-01-02"), n, batch, runs)
	kinds := map[string]bool{}
	for _, ss := range samples {
		for _, s := range ss {
			for k := range s.stmts {
				kinds[k] = true
			}
		}
	}
	var order []string
	for k := range kinds {
		order = append(order, k)
	}
	sort.Strings(order)
	header := "| | wall | Go CPU | server, all statements |"
	sep := "|---|---:|---:|---:|"
	for _, k := range order {
		header += " " + k + " |"
		sep += "---:|"
	}
	header += " rest (round trips, waits) |"
	sep += "---:|"
	fmt.Println(header)
	fmt.Println(sep)
	for i, v := range variants {
		wall := median(samples[i], func(s sample) float64 { return s.wall })
		cpu := median(samples[i], func(s sample) float64 { return s.cpu })
		var server float64
		cells := ""
		for _, k := range order {
			t := median(samples[i], func(s sample) float64 { return s.stmts[k] })
			calls := median(samples[i], func(s sample) float64 { return s.calls[k] })
			server += t
			if t == 0 && calls == 0 {
				cells += " — |"
				continue
			}
			cells += fmt.Sprintf(" %.2f (%.3g/batch) |", t, calls)
		}
		fmt.Printf("| %s | %.2f | %.2f | %.2f |%s %.2f |\n", v.name, wall, cpu, server, cells, max(wall-cpu-server, 0))
	}
	return nil
}

// statements adds to s the server time per message of each kind of
// statement since the last reset, and its calls per batch.
func statements(ctx context.Context, pool *pgxpool.Pool, s sample, n, batch int) error {
	rows, err := pool.Query(ctx, `SELECT query, calls, total_exec_time FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`)
	if err != nil {
		return err
	}
	defer rows.Close()
	batches := float64((n + batch - 1) / batch)
	for rows.Next() {
		var q string
		var calls int64
		var ms float64
		if err := rows.Scan(&q, &calls, &ms); err != nil {
			return err
		}
		k := kind(q)
		if k == "" {
			continue
		}
		s.stmts[k] += ms * 1000 / float64(n)
		s.calls[k] += float64(calls) / batches
	}
	return rows.Err()
}

// kind names a statement by what it does, or "" for the command's own
// statements (resets, counts).
func kind(q string) string {
	l := strings.ToLower(strings.Join(strings.Fields(q), " "))
	switch {
	case strings.Contains(l, "pg_stat_statements"), strings.HasPrefix(l, "select count(*) from ledger"),
		strings.HasPrefix(l, "truncate"), strings.HasPrefix(l, "vacuum"), strings.HasPrefix(l, "show"):
		return ""
	case strings.HasPrefix(l, "begin"), strings.HasPrefix(l, "set local"):
		return "BEGIN"
	case strings.HasPrefix(l, "commit"):
		return "COMMIT"
	case strings.Contains(l, "processed"): // idset's table, in any quoting
		return "marker INSERT"
	case strings.Contains(l, "into ledger"):
		return "effect INSERT"
	}
	return "other"
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func median(ss []sample, f func(sample) float64) float64 {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = f(s)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

func numCPU() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "processor\t:")
}
