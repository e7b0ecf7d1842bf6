package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Usage is what a run cost, beyond its wall time: CPU time of this process
// and of the PostgreSQL server, the machine's idle time, and the WAL work.
type Usage struct {
	Wall      time.Duration
	GoCPU     time.Duration // user + system time of this process
	PgCPU     time.Duration // user + system time of the server's processes; 0 if unknown
	PgKnown   bool          // whether PgCPU could be read (a local server)
	Idle      float64       // fraction of the machine's CPU time that was idle
	WALSyncs  int64         // pg_stat_wal.wal_sync
	WALSyncMS float64       // pg_stat_wal.wal_sync_time (with track_wal_io_timing)
	WALBytes  int64         // pg_stat_wal.wal_bytes
}

// Probe reads the counters a Usage is the difference of. It holds one
// connection of its own, so that reading them costs the measured pool
// nothing.
type Probe struct {
	conn       *pgx.Conn
	pid        int // the probe's backend, left out of the server's CPU time
	postmaster int
}

// NewProbe connects to the database url names.
func NewProbe(ctx context.Context, url string) (*Probe, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	p := &Probe{conn: conn}
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&p.pid); err != nil {
		conn.Close(ctx)
		return nil, err
	}
	if st, ok := procStat(p.pid); ok {
		p.postmaster = st.ppid
	}
	return p, nil
}

// EndConns runs end, which should close the measured connections, and
// waits until their backends have exited and the postmaster has reaped
// them: a backend reports its WAL counters as it exits, and its CPU time
// moves to the postmaster's reaped children only once it is reaped.
func (p *Probe) EndConns(ctx context.Context, end func()) error {
	rows, err := p.conn.Query(ctx, `SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()`)
	if err != nil {
		return err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return err
	}
	end()
	for _, pid := range pids {
		for {
			if p.postmaster > 1 {
				if st, ok := procStat(pid); !ok || st.ppid != p.postmaster {
					break // reaped (or its pid taken by another process)
				}
			} else { // a server elsewhere: wait for its backend to go
				var n int
				if err := p.conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
					return err
				}
				if n == 0 {
					break
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(2 * time.Millisecond):
			}
		}
	}
	return nil
}

// Close closes the probe's connection.
func (p *Probe) Close(ctx context.Context) error { return p.conn.Close(ctx) }

type counters struct {
	at                 time.Time
	goCPU              time.Duration
	pg                 map[int]time.Duration // per server process
	pgReaped           time.Duration         // the postmaster's children that exited
	pgKnown            bool
	cpuIdle, cpuTotal  int64
	walSyncs, walBytes int64
	walSyncMS          float64
}

func (p *Probe) read(ctx context.Context) (counters, error) {
	c := counters{at: time.Now()}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		c.goCPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	c.pg, c.pgReaped, c.pgKnown = p.serverCPU()
	c.cpuIdle, c.cpuTotal = machineCPU()
	err := p.conn.QueryRow(ctx, `SELECT wal_sync, wal_sync_time, wal_bytes::bigint FROM pg_stat_wal`).
		Scan(&c.walSyncs, &c.walSyncMS, &c.walBytes)
	return c, err
}

func diff(a, b counters) Usage {
	u := Usage{
		Wall:      b.at.Sub(a.at),
		GoCPU:     b.goCPU - a.goCPU,
		PgKnown:   a.pgKnown && b.pgKnown,
		WALSyncs:  b.walSyncs - a.walSyncs,
		WALSyncMS: b.walSyncMS - a.walSyncMS,
		WALBytes:  b.walBytes - a.walBytes,
	}
	if u.PgKnown {
		// Totals: a process that exited during the run moved its time from
		// the live processes to the postmaster's reaped children.
		u.PgCPU = b.pgReaped - a.pgReaped
		for _, t := range b.pg {
			u.PgCPU += t
		}
		for _, t := range a.pg {
			u.PgCPU -= t
		}
	}
	if total := b.cpuTotal - a.cpuTotal; total > 0 {
		u.Idle = float64(b.cpuIdle-a.cpuIdle) / float64(total)
	}
	return u
}

// clockTick is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

type stat struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

// procStat reads /proc/pid/stat.
func procStat(pid int) (stat, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return stat{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return stat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return stat{}, false
	}
	n := func(k int) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v }
	return stat{ppid: int(n(1)), utime: n(11), stime: n(12), cutime: n(13), cstime: n(14)}, true
}

// serverCPU returns the CPU time of each of the postmaster's children but
// the probe's own backend, and the time of its children that exited.
func (p *Probe) serverCPU() (map[int]time.Duration, time.Duration, bool) {
	if p.postmaster <= 1 {
		return nil, 0, false
	}
	pm, ok := procStat(p.postmaster)
	if !ok {
		return nil, 0, false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, 0, false
	}
	out := map[int]time.Duration{p.postmaster: time.Duration(pm.utime+pm.stime) * clockTick}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == p.pid {
			continue
		}
		if st, ok := procStat(pid); ok && st.ppid == p.postmaster {
			out[pid] = time.Duration(st.utime+st.stime) * clockTick
		}
	}
	return out, time.Duration(pm.cutime+pm.cstime) * clockTick, true
}

// machineCPU returns the idle and total jiffies of /proc/stat's cpu line.
func machineCPU() (idle, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	for k, s := range f[1:] {
		v, _ := strconv.ParseInt(s, 10, 64)
		total += v
		if k == 3 || k == 4 { // idle, iowait
			idle += v
		}
	}
	return idle, total
}

// Waits is how the server's backends of the measured database spent a run,
// sampled from pg_stat_activity: for each "state wait_event_type:wait_event"
// (CPU when active without a wait event), the share of the samples of
// backends not idle outside a transaction.
type Waits struct {
	Shares  map[string]float64
	Samples int // backend samples counted
	Polls   int
}

// Top returns the k largest shares, largest first, as "name 12%".
func (w Waits) Top(k int) []string {
	names := make([]string, 0, len(w.Shares))
	for n := range w.Shares {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int {
		if w.Shares[a] != w.Shares[b] {
			if w.Shares[a] > w.Shares[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var out []string
	for _, n := range names[:min(k, len(names))] {
		out = append(out, n+" "+strconv.Itoa(int(100*w.Shares[n]+0.5))+"%")
	}
	return out
}

// Measure reads the counters, runs f while sampling pg_stat_activity every
// interval on the probe's connection, runs settle (which should end the
// measured connections, so that their backends report their WAL counters
// as they exit), and returns what f cost.
func (p *Probe) Measure(ctx context.Context, interval time.Duration, f, settle func() error) (Usage, Waits, error) {
	before, err := p.read(ctx)
	if err != nil {
		return Usage{}, Waits{}, err
	}
	stop := make(chan struct{})
	var (
		wg     sync.WaitGroup
		counts = map[string]int{}
		waits  Waits
	)
	wg.Go(func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			rows, err := p.conn.Query(ctx, `SELECT state || ' ' || coalesce(wait_event_type || ':' || wait_event, 'CPU')
FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND pid <> pg_backend_pid() AND state <> 'idle'`)
			if err != nil {
				return
			}
			waits.Polls++
			for rows.Next() {
				var s string
				if rows.Scan(&s) == nil {
					counts[s]++
					waits.Samples++
				}
			}
			rows.Close()
		}
	})
	ferr := f()
	close(stop)
	wg.Wait()
	if ferr == nil {
		ferr = settle()
	}
	after, err := p.read(ctx)
	if ferr != nil {
		return Usage{}, Waits{}, ferr
	}
	if err != nil {
		return Usage{}, Waits{}, err
	}
	waits.Shares = map[string]float64{}
	for s, c := range counts {
		waits.Shares[s] = float64(c) / float64(max(waits.Samples, 1))
	}
	return diff(before, after), waits, nil
}
