package pgtest_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestNewPool(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.NewPool(t)

	var tables int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("fresh database has %d tables, want 0", tables)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE kv (k text PRIMARY KEY, v int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO kv VALUES ('a', 1), ('b', 2)`); err != nil {
		t.Fatal(err)
	}
	var sum int
	if err := pool.QueryRow(ctx, `SELECT sum(v) FROM kv`).Scan(&sum); err != nil {
		t.Fatal(err)
	}
	if sum != 3 {
		t.Fatalf("sum = %d, want 3", sum)
	}
}

func TestDistinctDatabases(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	a, b := pgtest.NewPool(t), pgtest.NewPool(t)
	var nameA, nameB string
	if err := a.QueryRow(ctx, `SELECT current_database()`).Scan(&nameA); err != nil {
		t.Fatal(err)
	}
	if err := b.QueryRow(ctx, `SELECT current_database()`).Scan(&nameB); err != nil {
		t.Fatal(err)
	}
	if nameA == nameB {
		t.Fatalf("both pools use database %q", nameA)
	}
}

func TestDatabaseDropped(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var name string
	t.Run("use", func(t *testing.T) {
		conn, err := pgx.Connect(ctx, pgtest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		// Left open on purpose: the drop must disconnect it.
		if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
			t.Fatal(err)
		}
	})
	conn, err := pgx.Connect(ctx, pgtest.Server(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("database %q still exists after cleanup", name)
	}
}

func TestStartStop(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	start := time.Now()
	c, err := pgtest.Start(ctx, pgtest.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("started in %v", time.Since(start))
	defer c.Stop()

	url, err := c.CreateDatabase(ctx, "second db")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	var name string
	err = conn.QueryRow(ctx, `SELECT current_database()`).Scan(&name)
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if name != "second db" {
		t.Fatalf("current_database() = %q, want %q", name, "second db")
	}

	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := pgx.Connect(ctx, c.URL()); err == nil {
		t.Fatal("connected after Stop")
	}
}
