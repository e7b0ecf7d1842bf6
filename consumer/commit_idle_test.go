package consumer

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/commitgate"
	"github.com/effectively-once/effectively/internal/pgerr"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A worker that stalled before sending its COMMIT (a stopped process) sends
// it after the server ended the idle session: the COMMIT never ran, and
// the batch is classified as rolled back, not as a lost COMMIT whose
// outcome must be looked for (the markers a probe would find may be those
// of the consumer that took its messages over meanwhile).
func TestCommitAfterIdleTxTimeout(t *testing.T) {
	t.Run("unix socket", func(t *testing.T) { commitAfterIdleTxTimeout(t, pgtest.NewPool(t)) })
	t.Run("tcp", func(t *testing.T) {
		// Through a TCP proxy that passes everything on.
		cfg, err := pgxpool.ParseConfig(pgtest.NewPool(t).Config().ConnString())
		if err != nil {
			t.Fatal(err)
		}
		gate := commitgate.New(t, &cfg.ConnConfig.Config)
		cfg.ConnConfig.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", gate.Addr())
		}
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		commitAfterIdleTxTimeout(t, pool)
	})
}

func commitAfterIdleTxTimeout(t *testing.T, pool *pgxpool.Pool) {
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var pid int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	// The timeout is the transaction's last statement, so that a loaded
	// machine cannot end the session before the test waits for it.
	if _, err := tx.Exec(ctx, idleSQL(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	// The client reads nothing meanwhile, as a stopped process would not.
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server did not end the idle session")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Over a Unix socket the write of COMMIT fails at once; over TCP it
	// goes out and the server's 25P03 is read.
	err = commitTx(ctx, tx)
	var ce *commitError
	if !errors.As(err, &ce) || ce.kind != commitTransient || !(pgerr.IdleTxTimeout(err) || errors.Is(err, errCommitNotSent)) {
		t.Fatalf("COMMIT after the server ended the idle session: %v, want it known rolled back", err)
	}
	t.Logf("COMMIT after the server ended the idle session: %v", err)
}
