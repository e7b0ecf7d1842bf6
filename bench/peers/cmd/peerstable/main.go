// Command peerstable runs the ledger workload of package peers through this
// library's Kafka pipeline, Watermill and hand-written kafka-go and franz-go
// consumers, side by side on one kfake cluster and one PostgreSQL, and
// prints the Markdown table BENCHMARKS.md shows:
//
//	cd bench/peers && go run ./cmd/peerstable [-scale 1] [-runs 3]
//
// It starts a throwaway PostgreSQL with fsync on unless DATABASE_URL names
// a database to use (its ledger, processed_ids and effectively tables are
// emptied). Progress goes to stderr, the table to stdout.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/effectively-once/effectively/bench/peers"
)

func main() {
	peers.MaybeWorker() // the consumers run in copies of this process
	scale := flag.Float64("scale", 1, "multiply the number of messages of every phase")
	runs := flag.Int("runs", 3, "throughput runs per system; the median is reported")
	only := flag.String("only", "", "comma-separated parts of system names to run (default: all)")
	flag.Parse()
	opts := peers.Options{
		Messages:      int(100_000 * *scale),
		PeerMessages:  int(10_000 * *scale),
		CrashMessages: int(10_000 * *scale),
		Runs:          *runs,
		DatabaseURL:   os.Getenv("DATABASE_URL"),
		Log:           os.Stderr,
	}
	if *only != "" {
		opts.Only = strings.Split(*only, ",")
	}
	rep, err := peers.Run(context.Background(), opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "peerstable:", err)
		os.Exit(1)
	}
	rep.Table(os.Stdout)
}
