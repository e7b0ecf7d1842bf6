package pgtest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options for Start.
type Options struct {
	// Fsync keeps fsync and synchronous_commit on (for benchmarks). Defaults to off (fast tests).
	Fsync bool
	// Logf receives progress lines; nil means quiet.
	Logf func(format string, args ...any)
	// Settings are more server settings ("name=value"), applied after the
	// defaults, which they override. Defaults to none.
	Settings []string
}

// Cluster is a running throwaway PostgreSQL server.
type Cluster struct {
	dir    string // data directory; also holds the socket and the server log
	pgCtl  string
	asUser string // OS user to run the server binaries as; "" means the current user
	url    string
	logf   func(format string, args ...any)

	stopOnce sync.Once
	stopErr  error
	untrack  func() // forgets it in the interrupt handler's list
}

const port = "5432"

// errNoBinaries tells how to make the PostgreSQL server binaries available.
var errNoBinaries = errors.New("PostgreSQL server binaries (initdb, pg_ctl) not found: " +
	"install them with `apt-get install -y postgresql` or set TEST_DATABASE_URL")

// Start initializes a new PostgreSQL cluster in a fresh temporary directory
// and starts a server on it that listens only on a Unix socket in that
// directory. The caller must call Stop to shut it down and remove the
// directory.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	begin := time.Now()
	initdb, pgCtl, err := findBinaries()
	if err != nil {
		return nil, err
	}
	reapOnce.Do(func() {
		logf := opts.Logf
		if logf == nil {
			logf = func(string, ...any) {}
		}
		reapOrphans(pgCtl, logf)
	})
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	c := &Cluster{dir: dir, pgCtl: pgCtl, logf: opts.Logf}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	c.untrack = track(c.Stop) // stopped on SIGINT or SIGTERM, even while starting
	fail := func(err error) (*Cluster, error) {
		c.untrack()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fail(err)
	}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			return fail(fmt.Errorf("running as root, and PostgreSQL needs a non-root user: %w", err))
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return fail(err)
		}
		c.asUser = u.Username
	}

	c.logf("pgtest: initdb %s", dir)
	out, err := c.command(ctx, initdb, "-D", dir, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput()
	if err != nil {
		return fail(fmt.Errorf("initdb: %w\n%s", err, bytes.TrimSpace(out)))
	}

	if err := writeOwner(dir); err != nil {
		return fail(err)
	}

	settings := []string{
		"listen_addresses=",
		"unix_socket_directories=" + dir,
		"port=" + port,
		"max_connections=300",
		"shared_buffers=128MB",
		"wal_level=logical", "max_replication_slots=64", "max_wal_senders=64",
	}
	if !opts.Fsync {
		settings = append(settings, "fsync=off", "synchronous_commit=off", "full_page_writes=off")
	}
	settings = append(settings, opts.Settings...)
	var serverOpts []string
	for _, s := range settings {
		serverOpts = append(serverOpts, "-c", shellQuote(s))
	}
	logFile := filepath.Join(dir, "log")
	out, err = c.command(ctx, pgCtl, "-D", dir, "-w", "-l", logFile, "start",
		"-o", strings.Join(serverOpts, " ")).CombinedOutput()
	if err != nil {
		err = fmt.Errorf("pg_ctl start: %w\n%s\nserver log:\n%s",
			err, bytes.TrimSpace(out), logTail(logFile, 20))
		c.Stop()
		return nil, fmt.Errorf("pgtest: %w", err)
	}

	host := strings.ReplaceAll(url.QueryEscape(dir), "%2F", "/")
	c.url = "postgres://postgres@/postgres?host=" + host + "&port=" + port + "&sslmode=disable"
	c.logf("pgtest: server running in %s (fsync %v), started in %v", dir, opts.Fsync, time.Since(begin).Round(time.Millisecond))
	return c, nil
}

// URL returns the connection URL of the "postgres" database, as the
// superuser "postgres".
func (c *Cluster) URL() string { return c.url }

// CreateDatabase creates the database name and returns its connection URL.
func (c *Cluster) CreateDatabase(ctx context.Context, name string) (url string, err error) {
	return createDatabase(ctx, c.url, name)
}

// Stop shuts the server down immediately and removes its data directory.
// Calling Stop more than once is harmless.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := c.command(ctx, c.pgCtl, "-D", c.dir, "-m", "immediate", "stop").CombinedOutput()
		if err != nil && c.url != "" { // the server may not have come up at all
			c.stopErr = fmt.Errorf("pgtest: pg_ctl stop: %w\n%s", err, bytes.TrimSpace(out))
		}
		if err := os.RemoveAll(c.dir); err != nil {
			c.stopErr = errors.Join(c.stopErr, fmt.Errorf("pgtest: %w", err))
		}
		c.logf("pgtest: server in %s stopped", c.dir)
		if c.untrack != nil {
			c.untrack()
		}
	})
	return c.stopErr
}

// command returns a command that runs a server binary as the cluster's user,
// in the data directory.
func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	if c.asUser != "" {
		args = append([]string{"-u", c.asUser, "--", name}, args...)
		name = "runuser"
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.dir
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// findBinaries returns the paths of initdb and pg_ctl, from PATH or else
// from the newest /usr/lib/postgresql/*/bin.
func findBinaries() (initdb, pgCtl string, err error) {
	if initdb, err := exec.LookPath("initdb"); err == nil {
		if initdb, err = filepath.EvalSymlinks(initdb); err == nil {
			// Prefer the pg_ctl of the same installation.
			if pgCtl := filepath.Join(filepath.Dir(initdb), "pg_ctl"); isExecutable(pgCtl) {
				return initdb, pgCtl, nil
			}
			if pgCtl, err := exec.LookPath("pg_ctl"); err == nil {
				return initdb, pgCtl, nil
			}
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { // newest first
		return compareVersions(filepath.Base(filepath.Dir(b)), filepath.Base(filepath.Dir(a)))
	})
	for _, d := range dirs {
		initdb, pgCtl := filepath.Join(d, "initdb"), filepath.Join(d, "pg_ctl")
		if isExecutable(initdb) && isExecutable(pgCtl) {
			return initdb, pgCtl, nil
		}
	}
	return "", "", fmt.Errorf("pgtest: %w", errNoBinaries)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// compareVersions compares dotted version numbers such as "9.6" and "15".
func compareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(as), len(bs)) {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if c := cmp.Compare(x, y); c != 0 {
			return c
		}
	}
	return 0
}

// shellQuote quotes s for /bin/sh, which pg_ctl uses to run the server.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// logTail returns the last n lines of the file at path.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// createDatabase creates the database name on the server at serverURL and
// returns the new database's connection URL.
func createDatabase(ctx context.Context, serverURL, name string) (string, error) {
	dbURL, err := databaseURL(serverURL, name)
	if err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("pgtest: create database %s: %w", name, err)
	}
	return dbURL, nil
}

// dropDatabase drops the database name on the server at serverURL,
// disconnecting any remaining sessions.
func dropDatabase(ctx context.Context, serverURL, name string) error {
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer conn.Close(context.Background())
	// A logical replication slot keeps its database from being dropped:
	// end its reader and drop it first.
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
WHERE database = $1 AND active_pid IS NOT NULL`, name); err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	for i := 0; ; i++ {
		_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name)
		if err == nil {
			break
		}
		if i == 50 || ctx.Err() != nil { // a terminated reader may hold its slot a moment longer
			return fmt.Errorf("pgtest: drop database %s: %w", name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	return nil
}

// databaseURL returns serverURL, a URL or a keyword/value connection
// string, with the database replaced by name.
func databaseURL(serverURL, name string) (string, error) {
	if strings.HasPrefix(serverURL, "postgres://") || strings.HasPrefix(serverURL, "postgresql://") {
		u, err := url.Parse(serverURL)
		if err != nil {
			return "", fmt.Errorf("pgtest: %w", err)
		}
		u.Path, u.RawPath = "/"+name, ""
		return u.String(), nil
	}
	// In a keyword/value string the last setting of a keyword wins.
	r := strings.NewReplacer(`\`, `\\`, `'`, `\'`)
	return serverURL + " dbname='" + r.Replace(name) + "'", nil
}
