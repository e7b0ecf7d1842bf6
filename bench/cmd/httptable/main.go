// Command httptable measures the idempotency middleware over loopback: N
// concurrent clients POST requests, each with a fresh Idempotency-Key, to
// a handler that writes one row in PostgreSQL, once bare (one transaction
// per request) and once under the middleware (lock, claim, the row and the
// stored response in one transaction). Runs alternate between the two, so
// the machine's changing load falls on both alike; it prints the median
// rates and the median of the runs' ratios as a Markdown table.
//
//	go run ./bench/cmd/httptable [-clients 8,32] [-requests 4000] [-runs 5] [-cpuprofile f]
//
// It starts a throwaway PostgreSQL with fsync on (as production runs) unless
// DATABASE_URL names a database to use; that database's http_payments and
// effectively tables are emptied.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/bench"
)

func main() {
	clients := flag.String("clients", "8,32", "comma-separated numbers of concurrent clients")
	requests := flag.Int("requests", 4000, "requests per run and variant")
	runs := flag.Int("runs", 5, "runs per variant; medians are reported")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the middleware's runs to this file")
	flag.Parse()
	if err := run(*clients, *requests, *runs, *cpuprofile); err != nil {
		fmt.Fprintln(os.Stderr, "httptable:", err)
		os.Exit(1)
	}
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	if len(xs)%2 == 0 {
		return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	return xs[len(xs)/2]
}

func run(clientList string, n, runs int, cpuprofile string) error {
	var levels []int
	for _, f := range strings.Split(clientList, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 {
			return fmt.Errorf("-clients: %q is not a positive number", f)
		}
		levels = append(levels, c)
	}
	ctx := context.Background()
	url, _, stop, err := bench.Database(ctx)
	if err != nil {
		return err
	}
	defer stop()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(slices.Max(levels))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	mw, err := bench.SetupHTTP(ctx, pool)
	if err != nil {
		return err
	}
	var version string
	_ = pool.QueryRow(ctx, `SHOW server_version`).Scan(&version)
	bare := httptest.NewServer(bench.BareHandler(pool))
	defer bare.Close()
	idem := httptest.NewServer(bench.IdempotentHandler(mw))
	defer idem.Close()

	var prof *os.File
	if cpuprofile != "" {
		if prof, err = os.Create(cpuprofile); err != nil {
			return err
		}
		defer prof.Close()
	}

	type row struct {
		clients               int
		bare, idem, ratio     []float64
		bareMed, idemMed, rat float64
	}
	var rows []*row
	seq := 0
	cpu, self := map[string][]float64{}, map[string][]float64{} // µs per request
	for _, c := range levels {
		r := &row{clients: c}
		rows = append(rows, r)
		// A warm-up of each, not counted.
		for _, u := range []string{bare.URL, idem.URL} {
			seq++
			if _, err := bench.LoadHTTP(ctx, u+"/payments", c, n/4, fmt.Sprintf("warm%d", seq)); err != nil {
				return err
			}
		}
		for i := 1; i <= runs; i++ {
			rate := map[string]float64{}
			order := []string{"bare", "idem"}
			if i%2 == 0 {
				order = []string{"idem", "bare"}
			}
			for _, v := range order {
				if err := bench.ResetHTTP(ctx, pool); err != nil {
					return err
				}
				u := bare.URL
				if v == "idem" {
					u = idem.URL
					if prof != nil && i == 1 {
						if err := pprof.StartCPUProfile(prof); err != nil {
							return err
						}
					}
				}
				seq++
				cpu0, self0 := machineCPU(), selfCPU()
				d, err := bench.LoadHTTP(ctx, u+"/payments", c, n, fmt.Sprintf("r%d", seq))
				cpu[v] = append(cpu[v], float64(machineCPU()-cpu0)/float64(n))
				self[v] = append(self[v], float64(selfCPU()-self0)/float64(n))
				if v == "idem" && prof != nil && i == 1 {
					pprof.StopCPUProfile()
				}
				if err != nil {
					return fmt.Errorf("%s, %d clients: %w", v, c, err)
				}
				rate[v] = float64(n) / d.Seconds()
			}
			r.bare = append(r.bare, rate["bare"])
			r.idem = append(r.idem, rate["idem"])
			r.ratio = append(r.ratio, rate["idem"]/rate["bare"])
			fmt.Fprintf(os.Stderr, "%d clients, run %d: bare %6.0f req/s, middleware %6.0f req/s (%.0f%%)\n",
				c, i, rate["bare"], rate["idem"], 100*rate["idem"]/rate["bare"])
		}
		r.bareMed, r.idemMed, r.rat = median(r.bare), median(r.idem), median(r.ratio)
	}

	fmt.Printf("PostgreSQL %s, fsync on, %d CPUs, %s; %d requests per run, median of %d runs; each request a fresh key, one row written per request.\n\n",
		version, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), n, runs)
	fmt.Println("| clients | bare handler req/s | with middleware req/s | middleware / bare |")
	fmt.Println("|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Printf("| %d | %.0f | %.0f | %.0f%% |\n", r.clients, r.bareMed, r.idemMed, 100*r.rat)
	}
	fmt.Println()
	fmt.Printf("CPU per request, median over all runs (machine-wide, of which this process: load generator, servers, pgx): bare %.0f µs (%.0f), middleware %.0f µs (%.0f)\n\n",
		median(cpu["bare"]), median(self["bare"]), median(cpu["idem"]), median(self["idem"]))
	for _, r := range rows {
		mark := "(met)"
		if r.rat < 0.7 {
			mark = "(MISSED)"
		}
		fmt.Printf("Target ≥ 70%% of the bare handler at %d clients: %.0f%% %s\n", r.clients, 100*r.rat, mark)
	}
	return nil
}

// machineCPU returns the machine's busy CPU time so far, in µs, from
// /proc/stat (0 where there is none).
func machineCPU() int64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy int64
	for i, x := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		v, _ := strconv.ParseInt(x, 10, 64)
		busy += v
	}
	return busy * 1e6 / 100 // USER_HZ
}

// selfCPU returns this process's CPU time so far, in µs.
func selfCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano()/1e3 + ru.Stime.Nano()/1e3
}
