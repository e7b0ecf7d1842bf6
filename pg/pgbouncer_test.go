package pg_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// bouncerPools returns n separate pools (n processes, as far as the
// server can tell) on one fresh database, through PgBouncer in
// transaction pooling mode, with the pgx exec mode given.
func bouncerPools(t *testing.T, n int, mode pgx.QueryExecMode) []*pgxpool.Pool {
	t.Helper()
	url := pgtest.BouncerURL(t)
	var pools []*pgxpool.Pool
	for range n {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = mode
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		pools = append(pools, pool)
	}
	return pools
}

// countingLine's migrations fail when applied twice (CREATE TABLE without
// IF NOT EXISTS) and count their runs in a table of their own.
func countingLine() pg.Line {
	return pg.Line{Name: "test:counted", FS: fstest.MapFS{
		"001_runs.sql":  {Data: []byte(`CREATE TABLE {{schema}}.runs (migration int NOT NULL); INSERT INTO {{schema}}.runs VALUES (1)`)},
		"002_more.sql":  {Data: []byte(`CREATE TABLE {{schema}}.more (id int); INSERT INTO {{schema}}.runs VALUES (2)`)},
		"003_index.sql": {Data: []byte(`CREATE INDEX more_id ON {{schema}}.more (id); INSERT INTO {{schema}}.runs VALUES (3)`)},
	}}
}

// Processes starting together through PgBouncer in transaction pooling
// apply each migration exactly once: the lock is transaction-level, so it
// lives and dies with the transaction that applies them, on whichever
// server connection the pooler gave it. A CREATE … IF NOT EXISTS that lost
// the race to another process's CREATE is run again in a new transaction.
func TestMigrateConcurrentlyThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const processes = 6
	pools := bouncerPools(t, processes, pgx.QueryExecModeExec)
	start := make(chan struct{})
	var wg sync.WaitGroup
	applied := make([]int, processes)
	errs := make([]error, processes)
	for i, pool := range pools {
		wg.Go(func() {
			// As the CLI does: list what is pending, then apply. The lookup
			// leaves the schema's absence in the server connection's catalog
			// cache, which Migrate must not trust once it holds the lock.
			if _, err := pg.PendingMigrations(ctx, pool, "app", countingLine()); err != nil {
				errs[i] = err
				return
			}
			<-start
			ms, err := pg.Migrate(ctx, pool, "app", countingLine())
			applied[i], errs[i] = len(ms), err
		})
	}
	close(start)
	wg.Wait()
	total := 0
	for i := range processes {
		if errs[i] != nil {
			t.Errorf("process %d: %v", i, errs[i])
		}
		total += applied[i]
	}
	if total != 3 {
		t.Errorf("%d migrations applied in all, want 3 (each exactly once): %v", total, applied)
	}
	var runs, recorded int
	if err := pools[0].QueryRow(ctx, `SELECT count(*) FROM app.runs`).Scan(&runs); err != nil {
		t.Fatal(err)
	}
	if err := pools[0].QueryRow(ctx, `SELECT count(*) FROM app.schema_migrations WHERE line = 'test:counted'`).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if runs != 3 || recorded != 3 {
		t.Errorf("runs %d, recorded versions %d; want 3 and 3", runs, recorded)
	}
	// And again, now that everything is applied.
	if ms, err := pg.Migrate(ctx, pools[1], "app", countingLine()); err != nil || len(ms) != 0 {
		t.Errorf("second Migrate: %d applied, %v; want 0, nil", len(ms), err)
	}
}

// Behind a transaction pooler, Migrate refuses a pool that keeps named
// prepared statements (pgx's default mode) before it touches anything,
// and says which setting to change.
func TestMigrateRefusesCachedStatementsThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeDescribeExec} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			pool := bouncerPools(t, 1, mode)[0]
			_, err := pg.Migrate(ctx, pool, "app", countingLine())
			if !errors.Is(err, pg.ErrTransactionPooling) {
				t.Fatalf("Migrate: %v; want ErrTransactionPooling", err)
			}
			t.Logf("Migrate says: %v", err)
			var schemas int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'app'`, pgx.QueryExecModeSimpleProtocol).Scan(&schemas); err != nil || schemas != 0 {
				t.Fatalf("Migrate created the schema before refusing (%v)", err)
			}
		})
	}
}

// CheckPooling tells a direct connection, a transaction pooler and a
// session pooler apart, and finds fault only where statements would break.
func TestCheckPooling(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	t.Run("direct", func(t *testing.T) {
		t.Parallel()
		p, err := pg.CheckPooling(ctx, pgtest.NewPool(t))
		if err != nil || p.Pooler || p.Transaction || p.Err() != nil || p.Warning() != "" {
			t.Fatalf("direct: %+v, %v; want no pooler and no complaint", p, err)
		}
	})
	t.Run("transaction", func(t *testing.T) {
		t.Parallel()
		p, err := pg.CheckPooling(ctx, bouncerPools(t, 1, pgx.QueryExecModeExec)[0])
		if err != nil || !p.Pooler || !p.Transaction || p.Err() != nil {
			t.Fatalf("transaction pooling, exec mode: %+v, %v; want a transaction pooler and no error", p, err)
		}
		p, err = pg.CheckPooling(ctx, bouncerPools(t, 1, pgx.QueryExecModeCacheStatement)[0])
		if err != nil || !p.Transaction || !errors.Is(p.Err(), pg.ErrTransactionPooling) {
			t.Fatalf("transaction pooling, cached statements: %+v, %v; want ErrTransactionPooling", p, err)
		}
	})
	t.Run("session", func(t *testing.T) {
		t.Parallel()
		b, err := pgtest.StartBouncer(ctx, pgtest.Server(t), pgtest.BouncerOptions{PoolMode: "session"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Stop() })
		pool, err := pgxpool.New(ctx, b.URL(pgtest.URL(t)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		p, err := pg.CheckPooling(ctx, pool)
		if err != nil || !p.Pooler || p.Transaction || p.Err() != nil || p.Warning() == "" {
			t.Fatalf("session pooling, cached statements: %+v, %v; want a pooler of unknown mode, a warning and no error", p, err)
		}
		// In session pooling the default mode works: Migrate goes through.
		if _, err := pg.Migrate(ctx, pool, "app", countingLine()); err != nil {
			t.Fatal(err)
		}
	})
}
