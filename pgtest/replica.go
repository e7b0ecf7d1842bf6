package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ReplicaOptions for StartReplicated.
type ReplicaOptions struct {
	// Fsync keeps fsync on, on both servers. Defaults to off (fast tests).
	Fsync bool
	// Synchronous makes the replication synchronous: the primary runs with
	// synchronous_commit = on and the standby named in
	// synchronous_standby_names, so a COMMIT returns only once the standby
	// has the transaction. Defaults to false: asynchronous replication, and
	// synchronous_commit as Fsync leaves it.
	Synchronous bool
	// Logf receives progress lines; nil means quiet.
	Logf func(format string, args ...any)
}

// StandbyName is the standby's application_name (its cluster_name), as
// synchronous_standby_names and pg_stat_replication name it.
const StandbyName = "standby"

// Replicated is a throwaway primary and a streaming standby made from it
// with pg_basebackup, each listening on a Unix socket in its own data
// directory.
type Replicated struct {
	Primary, Standby *Cluster
	sync             bool
	fsync            bool
}

// StartReplicated starts a primary, copies it with pg_basebackup -R into a
// standby that streams from it, starts the standby and returns once the
// primary sees it streaming (as a synchronous standby when asked). The
// caller must call Stop.
func StartReplicated(ctx context.Context, opts ReplicaOptions) (*Replicated, error) {
	begin := time.Now()
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	var settings []string
	if opts.Synchronous {
		settings = append(settings, "synchronous_commit=on", "synchronous_standby_names="+StandbyName)
	}
	primary, err := Start(ctx, Options{Fsync: opts.Fsync, Logf: logf, Settings: settings})
	if err != nil {
		return nil, err
	}
	r := &Replicated{Primary: primary, sync: opts.Synchronous, fsync: opts.Fsync}
	standby, err := startStandby(ctx, primary, opts.Fsync, logf)
	if err != nil {
		primary.Stop()
		return nil, err
	}
	r.Standby = standby
	if err := r.waitStreaming(ctx); err != nil {
		r.Stop()
		return nil, err
	}
	logf("pgtest: primary %s and standby %s (synchronous %v) running, started in %v",
		primary.dir, standby.dir, opts.Synchronous, time.Since(begin).Round(time.Millisecond))
	return r, nil
}

// startStandby copies primary into a new data directory with pg_basebackup
// -R and starts a hot standby on it.
func startStandby(ctx context.Context, primary *Cluster, fsync bool, logf func(string, ...any)) (*Cluster, error) {
	basebackup := filepath.Join(filepath.Dir(primary.pgCtl), "pg_basebackup")
	if !isExecutable(basebackup) {
		return nil, fmt.Errorf("pgtest: pg_basebackup not found next to %s", primary.pgCtl)
	}
	dir, err := os.MkdirTemp("", "pgtest-standby-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	c := &Cluster{dir: dir, pgCtl: primary.pgCtl, asUser: primary.asUser, logf: logf}
	fail := func(err error) (*Cluster, error) {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fail(err)
	}
	if fi, err := os.Stat(primary.dir); err == nil && primary.asUser != "" {
		st := fi.Sys().(*syscall.Stat_t)
		if err := os.Chown(dir, int(st.Uid), int(st.Gid)); err != nil {
			return fail(err)
		}
	}
	logf("pgtest: pg_basebackup %s -> %s", primary.dir, dir)
	out, err := c.command(ctx, basebackup, "-D", dir, "-h", primary.dir, "-p", port, "-U", "postgres",
		"-R", "-X", "stream", "--checkpoint=fast", "--no-sync").CombinedOutput()
	if err != nil {
		return fail(fmt.Errorf("pg_basebackup: %w\n%s", err, bytes.TrimSpace(out)))
	}
	// The primary keeps its socket and its log in its data directory: the
	// copies are not the standby's.
	for _, f := range []string{".s.PGSQL." + port + ".lock", "log"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fail(err)
		}
	}
	settings := []string{
		"listen_addresses=",
		"unix_socket_directories=" + dir,
		"port=" + port,
		"max_connections=300",
		"shared_buffers=128MB",
		"cluster_name=" + StandbyName,
		"wal_level=logical", "max_replication_slots=64", "max_wal_senders=64", // at least the primary's
	}
	if !fsync {
		settings = append(settings, "fsync=off", "full_page_writes=off")
	}
	var serverOpts []string
	for _, s := range settings {
		serverOpts = append(serverOpts, "-c", shellQuote(s))
	}
	logFile := filepath.Join(dir, "log")
	out, err = c.command(ctx, c.pgCtl, "-D", dir, "-w", "-l", logFile, "start",
		"-o", strings.Join(serverOpts, " ")).CombinedOutput()
	if err != nil {
		err = fmt.Errorf("pg_ctl start (standby): %w\n%s\nserver log:\n%s", err, bytes.TrimSpace(out), logTail(logFile, 20))
		c.Stop()
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	c.url = socketURL(dir)
	return c, nil
}

// socketURL is the URL of the "postgres" database of the server listening
// in dir.
func socketURL(dir string) string {
	host := strings.ReplaceAll(strings.ReplaceAll(dir, "%", "%25"), "&", "%26")
	return "postgres://postgres@/postgres?host=" + host + "&port=" + port + "&sslmode=disable"
}

// waitStreaming waits until the primary lists the standby as streaming,
// and as its synchronous standby when replication is synchronous.
func (r *Replicated) waitStreaming(ctx context.Context) error {
	want := "async"
	if r.sync {
		want = "sync"
	}
	return poll(ctx, "the standby to stream from the primary", func() (bool, error) {
		var n int
		err := queryRow(ctx, r.Primary.url, `SELECT count(*) FROM pg_stat_replication
WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2`, []any{StandbyName, want}, &n)
		return n == 1, err
	})
}

// URL returns a multi-host connection string for the database name, as
// an application that follows a failover uses: both servers, and
// target_session_attrs=read-write, so a connection goes to whichever of
// them accepts writes.
func (r *Replicated) URL(name string) string {
	q := strings.NewReplacer(`\`, `\\`, `'`, `\'`)
	return fmt.Sprintf("host='%s,%s' port=%s,%s user=postgres dbname='%s' sslmode=disable target_session_attrs=read-write",
		q.Replace(r.Primary.dir), q.Replace(r.Standby.dir), port, port, q.Replace(name))
}

// CreateDatabase creates the database name on the primary and returns its
// multi-host connection string (see URL).
func (r *Replicated) CreateDatabase(ctx context.Context, name string) (string, error) {
	if _, err := createDatabase(ctx, r.Primary.url, name); err != nil {
		return "", err
	}
	return r.URL(name), nil
}

// CatchUp returns once the standby has replayed everything the primary
// had committed when CatchUp was called, written out or not.
func (r *Replicated) CatchUp(ctx context.Context) error {
	var lsn string
	// The insert position, not the write position: under asynchronous
	// commit (the throwaway clusters' default) a commit's record can sit
	// in the WAL buffers, past pg_current_wal_lsn(), until the WAL writer
	// writes it out, and a catch-up to the write position would miss it.
	if err := queryRow(ctx, r.Primary.url, "SELECT pg_current_wal_insert_lsn()::text", nil, &lsn); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return poll(ctx, "the standby to replay "+lsn, func() (bool, error) {
		var done bool
		err := queryRow(ctx, r.Standby.url, "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", []any{lsn}, &done)
		return done, err
	})
}

// StopStreaming cuts the standby off from the primary: its WAL receiver
// stops (primary_conninfo is emptied) and it receives nothing more, so
// whatever the primary commits from then on is missing on the standby, as
// when an asynchronous standby lags at the moment the primary dies. It
// returns once the WAL receiver has stopped; what it received and has not
// replayed yet is replayed before a promotion ends. With synchronous replication
// the primary's commits then wait for a standby that never answers.
func (r *Replicated) StopStreaming(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, r.Standby.url)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET primary_conninfo = ''"); err != nil {
		return fmt.Errorf("pgtest: stop streaming: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgtest: stop streaming: %w", err)
	}
	return poll(ctx, "the standby's WAL receiver to stop", func() (bool, error) {
		var n int
		err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_wal_receiver").Scan(&n)
		return n == 0, err
	})
}

// KillPrimary kills the primary's postmaster and all its processes with
// SIGKILL, as a crash of its machine would: nothing is flushed or sent to
// the standby, and connected clients lose their sessions mid-statement. It
// returns once every process is gone. The primary's data directory stays
// until Stop.
func (r *Replicated) KillPrimary() error {
	pid, err := postmasterPID(r.Primary.dir)
	if err != nil {
		return err
	}
	// The postmaster's children, listed before it dies and they are
	// reparented.
	children := childrenOf(pid)
	procs := append([]int{pid}, children...)
	for _, p := range procs {
		if err := syscall.Kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("pgtest: kill %d: %w", p, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = poll(ctx, "the primary's processes to exit", func() (bool, error) {
		for _, p := range procs {
			if alive(p) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	r.Primary.logf("pgtest: primary %s killed (postmaster %d and %d children)", r.Primary.dir, pid, len(children))
	return nil
}

// Promote promotes the standby (pg_ctl promote) and returns once it
// accepts writes.
func (r *Replicated) Promote(ctx context.Context) error {
	s := r.Standby
	out, err := s.command(ctx, s.pgCtl, "-D", s.dir, "-w", "promote").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgtest: pg_ctl promote: %w\n%s\nserver log:\n%s",
			err, bytes.TrimSpace(out), logTail(filepath.Join(s.dir, "log"), 20))
	}
	err = poll(ctx, "the promoted standby to accept writes", func() (bool, error) {
		var ro string
		err := queryRow(ctx, s.url, "SHOW transaction_read_only", nil, &ro)
		return err == nil && ro == "off", nil
	})
	if err == nil {
		s.logf("pgtest: standby %s promoted", s.dir)
	}
	return err
}

// NewStandby makes another asynchronous standby of of (the promoted
// standby, say, as an HA manager gives the new primary a standby again)
// with pg_basebackup, starts it and returns once of lists it as streaming.
// The caller must Stop it.
func (r *Replicated) NewStandby(ctx context.Context, of *Cluster) (*Cluster, error) {
	c, err := startStandby(ctx, of, r.fsync, of.logf)
	if err != nil {
		return nil, err
	}
	err = poll(ctx, "the new standby to stream", func() (bool, error) {
		var n int
		err := queryRow(ctx, of.url, `SELECT count(*) FROM pg_stat_replication
WHERE application_name = $1 AND state = 'streaming'`, []any{StandbyName}, &n)
		return n == 1, err
	})
	if err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Stop stops both servers and removes their data directories.
func (r *Replicated) Stop() error {
	var errs []error
	if r.Standby != nil {
		errs = append(errs, r.Standby.Stop())
	}
	if r.Primary != nil {
		if err := r.Primary.Stop(); err != nil && !r.primaryGone() {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// primaryGone reports whether the primary's postmaster is not running (it
// was killed): pg_ctl stop then fails, which is expected.
func (r *Replicated) primaryGone() bool {
	pid, err := postmasterPID(r.Primary.dir)
	return err != nil || !alive(pid)
}

// postmasterPID reads the postmaster's process ID from postmaster.pid.
func postmasterPID(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgtest: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return 0, fmt.Errorf("pgtest: postmaster.pid: %w", err)
	}
	return pid, nil
}

// childrenOf returns the IDs of the processes whose parent is pid.
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _, ok := procStat(p); ok && ppid == pid {
			out = append(out, p)
		}
	}
	return out
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state != "Z" && state != "X"
}

// procStat returns the parent and the state of process pid, from
// /proc/pid/stat.
func procStat(pid int) (ppid int, state string, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, "", false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, "", false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, "", false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0], err == nil
}

// queryRow runs one query on a new connection to url and scans its row.
func queryRow(ctx context.Context, url, sql string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// poll calls cond every 20ms until it returns true, fails, or ctx is done.
func poll(ctx context.Context, what string, cond func() (bool, error)) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	var last error
	for {
		ok, err := cond()
		if err != nil {
			last = err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
		case <-t.C:
		}
	}
}
