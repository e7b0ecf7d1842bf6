// Command lanestable runs each handler shape of the consumer, and raw
// batched SQL, at 1, 2, 4 and 8 lanes (Config.Concurrency, and as many
// goroutines for raw SQL) side by side on one PostgreSQL, each with a pool
// of lanes + 2 connections, and prints a Markdown table of messages per
// second beside what each run cost: CPU time per message of this process
// and of the server, the machine's idle share, WAL fsyncs and their time
// (pg_stat_wal), and the server's wait events sampled from
// pg_stat_activity.
//
//	go run ./bench/cmd/lanestable [-scale 1] [-runs 3] [-lanes 1,2,4,8] [-synchronous-commit on,off]
//
// It starts a throwaway PostgreSQL with fsync on (as production runs) and
// track_wal_io_timing on unless DATABASE_URL names a database to use; that
// database's ledger and effectively tables are emptied. The server's CPU
// time is read from /proc, so only for a server on this machine.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/effectively-once/effectively/bench"
	"github.com/jackc/pgx/v5"
)

func main() {
	scale := flag.Float64("scale", 1, "multiply the number of messages per run (40,000)")
	runs := flag.Int("runs", 3, "runs per row; the median is reported")
	lanes := flag.String("lanes", "1,2,4,8", "comma-separated lane counts")
	batch := flag.Int("batch", 500, "batch size")
	commit := flag.String("synchronous-commit", "on", "comma-separated synchronous_commit settings to measure, e.g. on,off")
	flag.Parse()
	opts := bench.LanesOptions{Runs: *runs, Batch: *batch, Messages: int(40000 * *scale),
		SynchronousCommit: strings.Split(*commit, ",")}
	for _, s := range strings.Split(*lanes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "lanestable: -lanes: %q is not a positive number\n", s)
			os.Exit(2)
		}
		opts.Lanes = append(opts.Lanes, n)
	}
	if err := run(opts); err != nil {
		fmt.Fprintln(os.Stderr, "lanestable:", err)
		os.Exit(1)
	}
}

func run(opts bench.LanesOptions) error {
	ctx := context.Background()
	url, owned, stop, err := bench.Database(ctx)
	if err != nil {
		return err
	}
	defer stop()
	if owned {
		// The server is ours: time its WAL fsyncs.
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, `ALTER SYSTEM SET track_wal_io_timing = on`)
		if err == nil {
			_, err = conn.Exec(ctx, `SELECT pg_reload_conf()`)
		}
		conn.Close(ctx)
		if err != nil {
			return err
		}
	}
	return bench.LanesTable(ctx, url, opts, os.Stdout, os.Stderr)
}
