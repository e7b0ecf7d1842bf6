package pgtest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// BouncerOptions for StartBouncer.
type BouncerOptions struct {
	// PoolMode is PgBouncer's pool_mode: "transaction", "session" or
	// "statement". Defaults to "transaction".
	PoolMode string
	// PoolSize is PgBouncer's default_pool_size: the most server
	// connections per database and user. Defaults to 10.
	PoolSize int
	// Logf receives progress lines; nil means quiet.
	Logf func(format string, args ...any)
}

// Bouncer is a running PgBouncer in front of a server.
type Bouncer struct {
	dir    string // config, auth file, log and the Unix socket
	port   int
	server *url.URL
	cmd    *exec.Cmd
	exited chan struct{}
	logf   func(format string, args ...any)

	stopOnce sync.Once
	stopErr  error
	untrack  func() // forgets it in the interrupt handler's list
}

// bouncerPort names the Unix socket (.s.PGSQL.<port>) in the bouncer's
// private directory; it takes no TCP port.
const bouncerPort = 6432

// errNoBouncer tells how to make PgBouncer available.
var errNoBouncer = errors.New("pgbouncer not found (in PATH or /usr/sbin): " +
	"install it with `apt-get install -y pgbouncer` (.ci/run does)")

// StartBouncer starts PgBouncer in a fresh temporary directory, in front of
// the server at serverURL (a URL such as a Cluster's; the server must trust
// its user, or the URL carry a password). It listens only on a Unix socket in its directory, serves
// every database of the server (as the user of serverURL, trusted) and
// runs as the server's operating system user when the process runs as
// root. The caller must call Stop.
func StartBouncer(ctx context.Context, serverURL string, opts BouncerOptions) (*Bouncer, error) {
	bin, err := findBouncer()
	if err != nil {
		return nil, err
	}
	server, err := url.Parse(serverURL)
	if err != nil {
		return nil, fmt.Errorf("pgtest: bouncer: %w", err)
	}
	q := server.Query()
	host, port := cmp.Or(q.Get("host"), server.Hostname()), cmp.Or(q.Get("port"), server.Port(), "5432")
	usr := cmp.Or(server.User.Username(), "postgres")
	target := fmt.Sprintf("host=%s port=%s user=%s", host, port, usr)
	if pw, ok := server.User.Password(); ok {
		target += " password=" + pw
	}
	mode := cmp.Or(opts.PoolMode, "transaction")
	size := opts.PoolSize
	if size <= 0 {
		size = 10
	}
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	b := &Bouncer{dir: dir, port: bouncerPort, server: server, logf: opts.Logf, exited: make(chan struct{})}
	if b.logf == nil {
		b.logf = func(string, ...any) {}
	}
	fail := func(err error) (*Bouncer, error) {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: bouncer: %w", err)
	}
	ini := fmt.Sprintf(`[databases]
* = %s

[pgbouncer]
listen_addr =
unix_socket_dir = %s
listen_port = %d
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 2000
max_db_connections = 0
server_idle_timeout = 0
ignore_startup_parameters = extra_float_digits
logfile = %s
log_connections = 0
log_disconnections = 0
`, target, dir, b.port, filepath.Join(dir, "users.txt"), mode, size, filepath.Join(dir, "pgbouncer.log"))
	files := map[string]string{
		"pgbouncer.ini": ini,
		"users.txt":     fmt.Sprintf("%q \"\"\n", usr),
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			return fail(err)
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Dir = dir
	if os.Geteuid() == 0 {
		// PgBouncer refuses to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			return fail(fmt.Errorf("running as root, and PgBouncer needs a non-root user: %w", err))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, p := range []string{dir, filepath.Join(dir, "pgbouncer.ini"), filepath.Join(dir, "users.txt")} {
			if err := os.Chown(p, uid, gid); err != nil {
				return fail(err)
			}
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	b.cmd = cmd
	go func() { _ = cmd.Wait(); close(b.exited) }()
	b.untrack = track(b.Stop) // stopped on SIGINT or SIGTERM

	// Ready when a query through it reaches the server.
	begin := time.Now()
	var last error
	for {
		c, err := pgx.Connect(ctx, b.URL(serverURL))
		if err == nil {
			err = c.Ping(ctx)
			c.Close(context.Background())
			if err == nil {
				break
			}
		}
		last = err
		select {
		case <-b.exited:
			b.Stop()
			return nil, fmt.Errorf("pgtest: bouncer exited at start: %v\nlog:\n%s", cmd.ProcessState, logTail(filepath.Join(dir, "pgbouncer.log"), 20))
		case <-ctx.Done():
			b.Stop()
			return nil, fmt.Errorf("pgtest: bouncer did not answer: %w (last: %v)", ctx.Err(), last)
		case <-time.After(20 * time.Millisecond):
		}
	}
	b.logf("pgtest: pgbouncer (%s pooling) running in %s, started in %v", mode, dir, time.Since(begin).Round(time.Millisecond))
	return b, nil
}

// URL returns dbURL, a URL of a database on the bouncer's server, with its
// host and port replaced by the bouncer's: the same database, through
// PgBouncer.
func (b *Bouncer) URL(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return dbURL
	}
	q := u.Query()
	q.Set("host", b.dir)
	q.Set("port", strconv.Itoa(b.port))
	u.RawQuery = strings.ReplaceAll(q.Encode(), "%2F", "/")
	return u.String()
}

// Stop shuts PgBouncer down at once and removes its directory. Calling Stop
// more than once is harmless.
func (b *Bouncer) Stop() error {
	b.stopOnce.Do(func() {
		if b.cmd != nil && b.cmd.Process != nil {
			_ = b.cmd.Process.Signal(syscall.SIGTERM) // immediate shutdown
			select {
			case <-b.exited:
			case <-time.After(10 * time.Second):
				_ = b.cmd.Process.Kill()
				<-b.exited
			}
		}
		if err := os.RemoveAll(b.dir); err != nil {
			b.stopErr = fmt.Errorf("pgtest: %w", err)
		}
		b.logf("pgtest: pgbouncer in %s stopped", b.dir)
		if b.untrack != nil {
			b.untrack()
		}
	})
	return b.stopErr
}

// findBouncer returns the path of the pgbouncer binary: from PATH, or
// Debian's /usr/sbin/pgbouncer, which is not in a non-root user's PATH.
func findBouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if isExecutable("/usr/sbin/pgbouncer") {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", fmt.Errorf("pgtest: %w", errNoBouncer)
}
