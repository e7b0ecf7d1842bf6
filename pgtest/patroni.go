package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// PatroniOptions for StartPatroni.
type PatroniOptions struct {
	// Synchronous turns Patroni's synchronous_mode on: the primary names
	// its streaming standby in synchronous_standby_names, so a COMMIT
	// returns only once the standby has it, and Patroni fails over only to
	// that standby. Defaults to false: asynchronous replication.
	Synchronous bool
	// Logf receives progress lines; nil means quiet.
	Logf func(format string, args ...any)
}

// Patroni is a throwaway pair of PostgreSQL servers managed by Patroni,
// with a throwaway etcd as Patroni's store, as production runs an HA
// pair: Patroni elects the leader, makes the other member a streaming
// standby, and when the leader's postgres dies it promotes the standby and
// makes the old leader a standby of the new one (with pg_rewind). The
// servers listen on free TCP ports of 127.0.0.1 and trust every local
// connection. Patroni fails over at once when a leader's postgres crashes
// (primary_start_timeout = 0) instead of restarting it, and runs its loop
// every second (loop_wait = 1).
type Patroni struct {
	// Members are the two members, named "m0" and "m1". Which of them
	// leads changes with failovers: see Leader.
	Members []*PatroniMember

	dir   string // holds etcd's and the members' directories
	sync  bool
	etcd  *etcd
	cred  *syscall.Credential
	pgCtl string
	logf  func(format string, args ...any)

	stopOnce sync.Once
	stopErr  error
	untrack  func()
}

// StartPatroni starts etcd and two Patroni members in a fresh temporary
// directory, and returns once one member leads and accepts writes and the
// other streams from it (as its synchronous standby when asked). It
// returns an error wrapping ErrNoPatroni when patroni or etcd is not
// installed. The caller must call Stop.
func StartPatroni(ctx context.Context, opts PatroniOptions) (*Patroni, error) {
	begin := time.Now()
	patroniBin, err1 := exec.LookPath("patroni")
	etcdBin, err2 := exec.LookPath("etcd")
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("pgtest: %w", ErrNoPatroni)
	}
	_, pgCtl, err := findBinaries()
	if err != nil {
		return nil, err
	}
	removeOrphanedPatroni(pgCtl, orQuiet(opts.Logf))
	cred, err := serverUser()
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	dir, err := os.MkdirTemp("", "patroni-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	p := &Patroni{dir: dir, sync: opts.Synchronous, cred: cred, pgCtl: pgCtl, logf: orQuiet(opts.Logf)}
	p.untrack = track(p.Stop) // stopped on SIGINT or SIGTERM, even while starting
	fail := func(err error) (*Patroni, error) {
		p.Stop()
		return nil, fmt.Errorf("pgtest: patroni: %w", err)
	}
	if err := p.mkdir(dir); err != nil {
		return fail(err)
	}
	if err := writeOwner(dir); err != nil {
		return fail(err)
	}
	if p.etcd, err = startEtcd(ctx, etcdBin, dir, cred); err != nil {
		return fail(err)
	}
	for i := range 2 {
		m, err := p.startMember(patroniBin, "m"+strconv.Itoa(i), filepath.Dir(pgCtl))
		if err != nil {
			return fail(err)
		}
		p.Members = append(p.Members, m)
	}
	leader, err := p.Leader(ctx)
	if err != nil {
		return fail(err)
	}
	if err := p.WaitStreaming(ctx, leader, p.Other(leader)); err != nil {
		return fail(err)
	}
	p.logf("pgtest: patroni pair in %s (synchronous_mode %v, leader %s) running, started in %v",
		dir, p.sync, leader.Name, time.Since(begin).Round(time.Millisecond))
	return p, nil
}

// mkdir makes dir (if missing) owned by the servers' user.
func (p *Patroni) mkdir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	if p.cred != nil {
		return os.Chown(dir, int(p.cred.Uid), int(p.cred.Gid))
	}
	return nil
}

// Other returns the member that is not m.
func (p *Patroni) Other(m *PatroniMember) *PatroniMember {
	if p.Members[0] == m {
		return p.Members[1]
	}
	return p.Members[0]
}

// URL returns a multi-host connection string for the database name, as an
// application that follows a failover uses: both members, and
// target_session_attrs=read-write, so that a connection goes to whichever
// of them accepts writes.
func (p *Patroni) URL(name string) string {
	var hosts, ports []string
	for _, m := range p.Members {
		hosts = append(hosts, "127.0.0.1")
		ports = append(ports, strconv.Itoa(m.pgPort))
	}
	q := strings.NewReplacer(`\`, `\\`, `'`, `\'`)
	return fmt.Sprintf("host=%s port=%s user=postgres dbname='%s' sslmode=disable target_session_attrs=read-write",
		strings.Join(hosts, ","), strings.Join(ports, ","), q.Replace(name))
}

// CreateDatabase creates the database name on the leader, waits until the
// standby has it too (a client of the multi-host URL that meets the
// standby first gives up on a database it does not know) and returns its
// multi-host connection string (see URL).
func (p *Patroni) CreateDatabase(ctx context.Context, name string) (string, error) {
	leader, err := p.Leader(ctx)
	if err != nil {
		return "", err
	}
	if _, err := createDatabase(ctx, leader.URL(), name); err != nil {
		return "", err
	}
	if err := p.CatchUp(ctx, leader, p.Other(leader)); err != nil {
		return "", err
	}
	return p.URL(name), nil
}

// Leader waits until a member holds Patroni's leader key (its REST API
// answers 200 on /leader) and its server accepts writes, and returns it.
func (p *Patroni) Leader(ctx context.Context) (*PatroniMember, error) {
	var leader *PatroniMember
	err := p.poll(ctx, "a leader that accepts writes", func() (bool, error) {
		for _, m := range p.Members {
			if ok, err := p.leads(ctx, m); ok || err != nil {
				leader = m
				return ok, err
			}
		}
		return false, nil
	})
	return leader, err
}

// WaitLeader waits until m holds the leader key and its server accepts
// writes: after a failover, until Patroni has promoted it.
func (p *Patroni) WaitLeader(ctx context.Context, m *PatroniMember) error {
	return p.poll(ctx, m.Name+" to lead and accept writes", func() (bool, error) { return p.leads(ctx, m) })
}

// leads reports whether m holds the leader key and accepts writes.
func (p *Patroni) leads(ctx context.Context, m *PatroniMember) (bool, error) {
	code, err := httpGet(ctx, "http://127.0.0.1:"+strconv.Itoa(m.apiPort)+"/leader")
	if err != nil || code != http.StatusOK {
		return false, nil // not yet up, or not the leader
	}
	var ro string
	if err := queryRow(ctx, m.URL(), "SHOW transaction_read_only", nil, &ro); err != nil {
		return false, nil // promoting
	}
	return ro == "off", nil
}

// WaitStreaming waits until leader lists standby as streaming: after a
// failover, until Patroni has made the old leader a standby of the new
// one. With synchronous_mode it also waits until standby is leader's
// synchronous standby and Patroni's store says so (its REST API answers
// 200 on /sync): until then Patroni would not fail over to it.
func (p *Patroni) WaitStreaming(ctx context.Context, leader, standby *PatroniMember) error {
	want := "async"
	if p.sync {
		want = "sync"
	}
	return p.poll(ctx, standby.Name+" to stream from "+leader.Name+" ("+want+")", func() (bool, error) {
		var n int
		err := queryRow(ctx, leader.URL(), `SELECT count(*) FROM pg_stat_replication
WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2`, []any{standby.Name, want}, &n)
		if err != nil || n != 1 || !p.sync {
			return n == 1, err
		}
		code, err := httpGet(ctx, "http://127.0.0.1:"+strconv.Itoa(standby.apiPort)+"/sync")
		return code == http.StatusOK, err
	})
}

// CatchUp returns once standby has replayed everything primary had
// committed when CatchUp was called, written out or not.
func (p *Patroni) CatchUp(ctx context.Context, primary, standby *PatroniMember) error {
	var lsn string
	if err := queryRow(ctx, primary.URL(), "SELECT pg_current_wal_insert_lsn()::text", nil, &lsn); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return p.poll(ctx, standby.Name+" to replay "+lsn, func() (bool, error) {
		var done bool
		err := queryRow(ctx, standby.URL(), "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", []any{lsn}, &done)
		return done, err
	})
}

// CutOff cuts the standbys off from primary, as when an asynchronous
// standby lags at the moment the primary dies: primary's pg_hba.conf
// rejects replication connections from then on and its WAL senders are
// ended, so whatever it commits from then on is missing on the standby.
// Patroni writes pg_hba.conf again when it next starts that server. It
// returns once primary has reloaded its configuration and streams to no
// standby. With synchronous_mode, primary's commits then wait for a
// standby that never answers.
func (p *Patroni) CutOff(ctx context.Context, primary *PatroniMember) error {
	hba := "local all all trust\nhost replication all 127.0.0.1/32 reject\nhost all all 127.0.0.1/32 trust\n"
	if err := os.WriteFile(filepath.Join(primary.dataDir, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return fmt.Errorf("pgtest: cut off: %w", err)
	}
	conn, err := pgx.Connect(ctx, primary.URL())
	if err != nil {
		return fmt.Errorf("pgtest: cut off: %w", err)
	}
	defer conn.Close(context.Background())
	var before time.Time
	if err := conn.QueryRow(ctx, "SELECT pg_conf_load_time()").Scan(&before); err != nil {
		return fmt.Errorf("pgtest: cut off: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgtest: cut off: %w", err)
	}
	// A new session carries the postmaster's load time: once it is later,
	// a new replication connection meets the new pg_hba.conf.
	err = p.poll(ctx, primary.Name+" to reload its configuration", func() (bool, error) {
		var loaded time.Time
		err := queryRow(ctx, primary.URL(), "SELECT pg_conf_load_time()", nil, &loaded)
		return err == nil && loaded.After(before), err
	})
	if err != nil {
		return err
	}
	return p.poll(ctx, primary.Name+"'s WAL senders to end", func() (bool, error) {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_replication`).Scan(&n)
		return err == nil && n == 0, err
	})
}

// Kill kills m's postmaster and all its processes with SIGKILL (the
// postmaster's ID read from postmaster.pid in its data directory), as a
// crash of the server would; m's Patroni keeps running and reacts. It
// returns once every process is gone.
func (p *Patroni) Kill(m *PatroniMember) error {
	pid, err := postmasterPID(m.dataDir)
	if err != nil {
		return err
	}
	procs := append([]int{pid}, childrenOf(pid)...)
	for _, proc := range procs {
		if err := syscall.Kill(proc, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("pgtest: kill %d: %w", proc, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = poll(ctx, m.Name+"'s server processes to exit", func() (bool, error) {
		for _, proc := range procs {
			if alive(proc) {
				return false, nil
			}
		}
		return true, nil
	})
	if err == nil {
		p.logf("pgtest: %s's postgres killed (postmaster %d and %d children)", m.Name, pid, len(procs)-1)
	}
	return err
}

// poll is pgtest's poll, failing at once when a member's Patroni exits
// and adding the members' logs to a timeout.
func (p *Patroni) poll(ctx context.Context, what string, cond func() (bool, error)) error {
	err := poll(ctx, what, func() (bool, error) {
		for _, m := range p.Members {
			select {
			case <-m.exited:
				return false, fmt.Errorf("patroni %s exited: %v", m.Name, m.cmd.ProcessState)
			default:
			}
		}
		return cond()
	})
	if err != nil {
		var logs []string
		for _, m := range p.Members {
			logs = append(logs, m.Name+"'s patroni log:\n"+m.Log(15))
		}
		err = fmt.Errorf("%w\n%s", err, strings.Join(logs, "\n"))
	}
	return err
}

// Stop kills the Patroni processes, their servers and etcd, and removes
// the directory. Calling Stop more than once is harmless.
func (p *Patroni) Stop() error {
	p.stopOnce.Do(func() {
		for _, m := range p.Members {
			_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
			<-m.exited
		}
		for _, m := range p.Members {
			if pid, err := postmasterPID(m.dataDir); err == nil && alive(pid) {
				c := &Cluster{dir: m.dataDir, pgCtl: p.pgCtl, asUser: ownerOf(p.dir)}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				if out, err := c.command(ctx, p.pgCtl, "-D", m.dataDir, "-m", "immediate", "stop").CombinedOutput(); err != nil {
					p.stopErr = errors.Join(p.stopErr, fmt.Errorf("pgtest: pg_ctl stop %s: %w\n%s", m.Name, err, out))
				}
				cancel()
			}
		}
		if p.etcd != nil {
			p.etcd.stop()
		}
		if err := os.RemoveAll(p.dir); err != nil {
			p.stopErr = errors.Join(p.stopErr, fmt.Errorf("pgtest: %w", err))
		}
		p.logf("pgtest: patroni pair in %s stopped", p.dir)
		p.untrack()
	})
	return p.stopErr
}

// removeOrphanedPatroni stops the servers and removes the directories of
// the pairs under os.TempDir() whose owner process died without stopping
// them (a test binary past its -timeout): their etcd and Patroni died
// with it (Pdeathsig, and reaper's handler, which also stops the servers,
// save one that Patroni was starting at that moment).
func removeOrphanedPatroni(pgCtl string, logf func(string, ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "patroni-*"))
	for _, dir := range dirs {
		if !orphaned(dir) {
			continue
		}
		data, _ := filepath.Glob(filepath.Join(dir, "m*", "data"))
		for _, d := range data {
			c := &Cluster{dir: d, pgCtl: pgCtl, asUser: ownerOf(d)}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			_ = c.command(ctx, pgCtl, "-D", d, "-m", "immediate", "stop").Run() // not running: nothing to stop
			cancel()
		}
		if os.RemoveAll(dir) == nil {
			logf("pgtest: removed the Patroni pair's directory %s, whose process had died without stopping it", dir)
		}
	}
}

// orQuiet returns logf, or a function that drops its lines when it is nil.
func orQuiet(logf func(string, ...any)) func(string, ...any) {
	if logf == nil {
		return func(string, ...any) {}
	}
	return logf
}
