package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// startReplicated starts a primary and a standby with a database "app"
// holding a table t of one committed row, and returns the database's
// multi-host URL and a pool on it.
func startReplicated(ctx context.Context, t *testing.T, synchronous bool) (*pgtest.Replicated, string, *pgxpool.Pool) {
	t.Helper()
	r, err := pgtest.StartReplicated(ctx, pgtest.ReplicaOptions{Synchronous: synchronous, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Error(err)
		}
	})
	url, err := r.CreateDatabase(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(ctx, `CREATE TABLE t (v int); INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	return r, url, pool
}

// A row committed on a synchronous primary is on the standby once it is
// promoted, and the multi-host pool reaches the promoted standby.
func TestReplicatedFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, _, pool := startReplicated(ctx, t, true)
	if err := r.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO t VALUES (2)`); err == nil {
		t.Fatal("an insert succeeded with the primary killed and the standby not promoted")
	}
	if err := r.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if _, err := pool.Exec(ctx, `INSERT INTO t VALUES (3)`); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("%d rows on the promoted standby, want 2 (the one committed before the kill, one after)", n)
	}
}

// With asynchronous replication and the standby cut off by StopStreaming,
// what the primary commits afterwards is missing once the standby is
// promoted.
func TestReplicatedAsyncLoss(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, url, pool := startReplicated(ctx, t, false)
	if err := r.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.StopStreaming(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO t VALUES (2)`); err != nil {
		t.Fatal(err)
	}
	if err := r.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	if err := r.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	// A new connection: the pool's idle ones went to the dead primary.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%d rows on the promoted standby, want 1: the row committed after StopStreaming is lost", n)
	}
}
