// Command httptable measures the idempotency middleware over loopback: N
// concurrent clients POST requests, each with a fresh Idempotency-Key, to
// a handler that writes one row in PostgreSQL: bare (one transaction per
// request), with a hand-written idempotency-key table (the key inserted,
// the row written, the response stored, in one transaction, as Stripe
// describes it), and under the middleware (the key's lock and the read of
// its row, the handler's row, the stored response in one transaction). Runs rotate the order of the three,
// so the machine's changing load falls on all alike; it prints the median
// rates and the medians of the runs' ratios as a Markdown table, and what
// each writes: WAL bytes per request, which, unlike the rates, does not
// move with the machine's load.
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
	variants := []string{"bare", "hand", "idem"}
	servers := map[string]*httptest.Server{
		"bare": httptest.NewServer(bench.BareHandler(pool)),
		"hand": httptest.NewServer(bench.HandWrittenHandler(pool)),
		"idem": httptest.NewServer(bench.IdempotentHandler(mw)),
	}
	for _, srv := range servers {
		defer srv.Close()
	}

	var prof *os.File
	if cpuprofile != "" {
		if prof, err = os.Create(cpuprofile); err != nil {
			return err
		}
		defer prof.Close()
	}

	type row struct {
		clients int
		rate    map[string][]float64 // req/s per variant, per run
		vsHand  []float64            // middleware / hand-written, per run
		vsBare  []float64            // middleware / bare, per run
	}
	var rows []*row
	seq := 0
	cpu, self := map[string][]float64{}, map[string][]float64{} // µs per request
	wal := map[string][]float64{}                               // bytes per request
	// CPU of this process and its PostgreSQL server per request, when the
	// server runs on this machine: the work a request costs, whatever else
	// the machine runs, which the rates are not.
	own := map[string][]float64{}
	postmaster := serverPID(ctx, pool)
	for _, c := range levels {
		r := &row{clients: c, rate: map[string][]float64{}}
		rows = append(rows, r)
		// A warm-up of each, not counted.
		for _, v := range variants {
			seq++
			if _, err := bench.LoadHTTP(ctx, servers[v].URL+"/payments", c, n/4, fmt.Sprintf("warm%d", seq)); err != nil {
				return err
			}
		}
		for i := 1; i <= runs; i++ {
			rate := map[string]float64{}
			for j := range variants {
				v := variants[(i+j)%len(variants)] // each run starts with the next variant
				if err := bench.ResetHTTP(ctx, pool); err != nil {
					return err
				}
				profiling := v == "idem" && prof != nil && i == 1
				if profiling {
					if err := pprof.StartCPUProfile(prof); err != nil {
						return err
					}
				}
				seq++
				cpu0, self0, srv0 := machineCPU(), selfCPU(), serverCPU(postmaster)
				lsn0, lerr := walLSN(ctx, pool)
				d, err := bench.LoadHTTP(ctx, servers[v].URL+"/payments", c, n, fmt.Sprintf("r%d", seq))
				cpu[v] = append(cpu[v], float64(machineCPU()-cpu0)/float64(n))
				self[v] = append(self[v], float64(selfCPU()-self0)/float64(n))
				if postmaster != 0 {
					own[v] = append(own[v], float64(selfCPU()-self0+serverCPU(postmaster)-srv0)/float64(n))
				}
				if lerr == nil {
					if b, err := walSince(ctx, pool, lsn0); err == nil {
						wal[v] = append(wal[v], b/float64(n))
					}
				}
				if profiling {
					pprof.StopCPUProfile()
				}
				if err != nil {
					return fmt.Errorf("%s, %d clients: %w", v, c, err)
				}
				rate[v] = float64(n) / d.Seconds()
				r.rate[v] = append(r.rate[v], rate[v])
			}
			r.vsHand = append(r.vsHand, rate["idem"]/rate["hand"])
			r.vsBare = append(r.vsBare, rate["idem"]/rate["bare"])
			fmt.Fprintf(os.Stderr, "%d clients, run %d: bare %6.0f req/s, hand-written %6.0f req/s, middleware %6.0f req/s (%.0f%% of hand-written, %.0f%% of bare)\n",
				c, i, rate["bare"], rate["hand"], rate["idem"], 100*rate["idem"]/rate["hand"], 100*rate["idem"]/rate["bare"])
		}
	}

	fmt.Printf("PostgreSQL %s, fsync on, %d CPUs, %s; %d requests per run, median of %d runs; each request a fresh key, one row written per request.\n\n",
		version, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), n, runs)
	fmt.Println("| clients | bare handler req/s | hand-written key table req/s | with middleware req/s | middleware / hand-written | middleware / bare |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Printf("| %d | %.0f | %.0f | %.0f | %.0f%% | %.0f%% |\n", r.clients,
			median(r.rate["bare"]), median(r.rate["hand"]), median(r.rate["idem"]), 100*median(r.vsHand), 100*median(r.vsBare))
	}
	fmt.Println()
	fmt.Printf("CPU per request, median over all runs (machine-wide, of which this process: load generator, servers, pgx): bare %.0f µs (%.0f), hand-written %.0f µs (%.0f), middleware %.0f µs (%.0f)\n\n",
		median(cpu["bare"]), median(self["bare"]), median(cpu["hand"]), median(self["hand"]), median(cpu["idem"]), median(self["idem"]))
	if len(own["idem"]) > 0 {
		fmt.Printf("CPU per request of this process and its PostgreSQL server, median over all runs: bare %.0f µs, hand-written %.0f µs, middleware %.0f µs (middleware / hand-written as a rate: %.0f%%, middleware / bare: %.0f%%)\n\n",
			median(own["bare"]), median(own["hand"]), median(own["idem"]),
			100*median(own["hand"])/median(own["idem"]), 100*median(own["bare"])/median(own["idem"]))
	}
	if len(wal["idem"]) > 0 {
		fmt.Printf("WAL per request, median over all runs: bare %.0f bytes, hand-written %.0f bytes, middleware %.0f bytes\n\n",
			median(wal["bare"]), median(wal["hand"]), median(wal["idem"]))
	}
	for _, r := range rows {
		fmt.Printf("Target ≥ 95%% of the hand-written handler at %d clients: %.0f%% %s\n", r.clients, 100*median(r.vsHand), met(median(r.vsHand) >= 0.95))
		fmt.Printf("Target ≥ 70%% of the bare handler at %d clients: %.0f%% %s\n", r.clients, 100*median(r.vsBare), met(median(r.vsBare) >= 0.7))
	}
	return nil
}

func met(ok bool) string {
	if ok {
		return "(met)"
	}
	return "(MISSED)"
}

// serverPID returns the process ID of pool's PostgreSQL server when it runs
// on this machine (the parent of this session's backend), else 0.
func serverPID(ctx context.Context, pool *pgxpool.Pool) int {
	var backend int
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0
	}
	f := procStat(backend)
	if len(f) < 4 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[3])
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", ppid)); err != nil || !strings.HasSuffix(exe, "postgres") {
		return 0
	}
	return ppid
}

// procStat returns the fields of /proc/pid/stat, the command's name
// (which may hold spaces) as one.
func procStat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return nil
	}
	return append([]string{s[:open-1], s[open+1 : end]}, strings.Fields(s[end+1:])...)
}

// serverCPU returns the CPU time, in µs, of the PostgreSQL server whose
// postmaster is pid: its own and its exited children's, and its live
// children's (backends, the WAL writer, autovacuum workers).
func serverCPU(pid int) int64 {
	if pid == 0 {
		return 0
	}
	ticks := func(f []string, fields ...int) int64 {
		var t int64
		for _, i := range fields {
			if i < len(f) {
				v, _ := strconv.ParseInt(f[i], 10, 64)
				t += v
			}
		}
		return t
	}
	total := ticks(procStat(pid), 13, 14, 15, 16) // utime, stime, cutime, cstime
	entries, _ := os.ReadDir("/proc")
	want := strconv.Itoa(pid)
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := procStat(child); len(f) > 14 && f[3] == want {
			total += ticks(f, 13, 14)
		}
	}
	return total * 1e6 / 100 // USER_HZ
}

// walLSN returns the server's current WAL insert position.
func walLSN(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var lsn string
	err := pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn)
	return lsn, err
}

// walSince returns how many bytes of WAL the server wrote since lsn.
func walSince(ctx context.Context, pool *pgxpool.Pool, lsn string) (float64, error) {
	var b float64
	err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::float8`, lsn).Scan(&b)
	return b, err
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
