package pgtest_test

import (
	"testing"

	"github.com/effectively-once/effectively/pgtest"
)

// TestBouncerPoolsTransactions checks that the shared PgBouncer is a real
// transaction pooler: the client is told a process ID that is not its
// server's, and a server connection serves another client as soon as a
// transaction ends, while the first client stays connected.
func TestBouncerPoolsTransactions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.NewBouncerPool(t, nil)

	a, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release()
	var serverA uint32
	if err := a.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&serverA); err != nil {
		t.Fatal(err)
	}
	if told := a.Conn().PgConn().PID(); told == serverA {
		t.Fatalf("the client was told the server's own process ID %d: not through PgBouncer", told)
	}
	b, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	if a.Conn() == b.Conn() {
		t.Fatal("one client connection acquired twice")
	}
	var serverB uint32
	if err := b.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&serverB); err != nil {
		t.Fatal(err)
	}
	if serverA != serverB {
		t.Fatalf("second client got server %d, first had %d: PgBouncer does not hand a server back after a transaction (not transaction pooling)", serverB, serverA)
	}
}
