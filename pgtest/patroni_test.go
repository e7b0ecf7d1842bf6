//go:build patroni

package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
)

// Patroni fails over when the leader's postgres is killed: the standby is
// promoted with every row a synchronous COMMIT returned for, the
// multi-host URL reaches it, and the old leader comes back as its standby.
func TestPatroniFailover(t *testing.T) {
	p := pgtest.NewPatroni(t, pgtest.PatroniOptions{Synchronous: true})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url, err := p.CreateDatabase(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE t (v int); INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	leader, err := p.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	standby := p.Other(leader)
	begin := time.Now()
	if err := p.Kill(leader); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitLeader(ctx, standby); err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(begin)
	if err := p.WaitStreaming(ctx, standby, leader); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s promoted %v after the kill, %s streaming from it %v after", standby.Name, promoted.Round(time.Millisecond), leader.Name, time.Since(begin).Round(time.Millisecond))
	conn, err = pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows (%v) on the promoted standby, want 1", n, err)
	}
}
