package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// shared is the cluster the test helpers start on first use.
var shared struct {
	once    sync.Once
	cluster *Cluster
	err     error
}

// Main runs the tests and then stops the shared cluster, if one was
// started, and exits with the tests' exit code. Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	stopBouncer()
	shared.once.Do(func() {}) // wait for a start in progress, forbid later ones
	if shared.cluster != nil {
		if err := shared.cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	os.Exit(code)
}

// Server returns the URL of the server's "postgres" database, for tests
// that manage several databases themselves. It is TEST_DATABASE_URL if that
// is set, and otherwise the shared cluster's URL.
func Server(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		shared.cluster, shared.err = Start(ctx, Options{Fsync: os.Getenv("PGTEST_FSYNC") == "on"})
	})
	if shared.err != nil {
		tb.Fatalf("%v", shared.err)
	}
	return shared.cluster.URL()
}

// URL creates a fresh, empty database for the test and returns its URL.
// The database is dropped, with any sessions still connected to it, when
// the test and its subtests have finished.
func URL(tb testing.TB) string {
	tb.Helper()
	server := Server(tb)
	b := make([]byte, 6)
	rand.Read(b)
	name := "t_" + hex.EncodeToString(b)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url, err := createDatabase(ctx, server, name)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := dropDatabase(ctx, server, name); err != nil {
			tb.Errorf("%v", err)
		}
	})
	return url
}

// NewPool returns a connection pool on a fresh, empty database (see URL).
// The pool is closed before the database is dropped.
func NewPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	url := URL(tb)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(pool.Close) // runs before the drop registered by URL
	return pool
}

// sharedBouncer is the PgBouncer the bouncer helpers start on first use.
var sharedBouncer struct {
	once    sync.Once
	bouncer *Bouncer
	err     error
}

// stopBouncer stops the shared PgBouncer, if one was started.
func stopBouncer() {
	sharedBouncer.once.Do(func() {}) // wait for a start in progress, forbid later ones
	if sharedBouncer.bouncer != nil {
		if err := sharedBouncer.bouncer.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
}

// SharedBouncer returns the PgBouncer, in transaction pooling mode, that
// the bouncer helpers share in front of Server's server; it starts it on
// first use, and Main stops it. The test fails if the pgbouncer binary is
// missing, with the command that installs it.
func SharedBouncer(tb testing.TB) *Bouncer {
	tb.Helper()
	server := Server(tb)
	sharedBouncer.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		sharedBouncer.bouncer, sharedBouncer.err = StartBouncer(ctx, server, BouncerOptions{})
	})
	if sharedBouncer.err != nil {
		tb.Fatalf("%v", sharedBouncer.err)
	}
	return sharedBouncer.bouncer
}

// BouncerURL creates a fresh, empty database for the test, as URL does, and
// returns its URL through the shared PgBouncer (transaction pooling).
func BouncerURL(tb testing.TB) string {
	tb.Helper()
	b := SharedBouncer(tb)
	return b.URL(URL(tb))
}

// NewBouncerPool returns a connection pool on a fresh, empty database
// through the shared PgBouncer in transaction pooling mode. The pool runs
// its statements in pgx.QueryExecModeExec, as the library's documentation
// asks for behind a transaction pooler; configure, if not nil, may change
// that or anything else before the pool is made. The pool is closed before
// the database is dropped.
func NewBouncerPool(tb testing.TB, configure func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(BouncerURL(tb))
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	if configure != nil {
		configure(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// NewPatroni starts a Patroni-managed pair for the test (StartPatroni) and
// stops it when the test ends. When patroni or etcd is not installed it
// skips the test, saying what to install, unless the environment variable
// CI is set: there a missing binary fails the test, so that a CI machine
// never passes by skipping.
func NewPatroni(tb testing.TB, opts PatroniOptions) *Patroni {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if opts.Logf == nil {
		opts.Logf = tb.Logf
	}
	p, err := StartPatroni(ctx, opts)
	if errors.Is(err, ErrNoPatroni) && os.Getenv("CI") == "" {
		tb.Skipf("skipping: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return p
}
