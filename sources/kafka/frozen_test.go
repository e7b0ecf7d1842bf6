package kafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/jackc/pgx/v5"
)

// freeze begins a transaction for batch b the way the consumer engine does
// (effects, then BeforeCommit) and leaves it open: a worker frozen between
// BeforeCommit and its commit, holding the lock of the partition's offsets
// row. It returns the transaction and the pid of its session.
func (e *env) freeze(ctx context.Context, s *Source, b *consumer.Batch) (pgx.Tx, int) {
	e.t.Helper()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	var pid int
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		e.t.Fatal(err)
	}
	for _, m := range b.Messages {
		_, _, off, _ := Position(m)
		if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2, $3)`, m.ID, m.Lane, off); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := s.BeforeCommit(ctx, tx, b, b.Messages); err != nil {
		e.t.Fatal(err)
	}
	return tx, pid
}

// sessionState returns the state of the session with pid ("" when it is gone).
func (e *env) sessionState(pid int) string {
	e.t.Helper()
	var state string
	err := e.pool.QueryRow(context.Background(), `SELECT coalesce(state, '') FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return state
}

// effectsOn returns the number of distinct messages of lane with an effect
// (on is true), or of the other lanes (on is false).
func (e *env) effectsOn(lane string, on bool) int {
	e.t.Helper()
	var n int
	err := e.pool.QueryRow(context.Background(),
		`SELECT count(DISTINCT (lane, off)) FROM effects WHERE (lane = $1) = $2`, lane, on).Scan(&n)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// TestFrozenWorker: a worker freezes with its batch transaction past
// BeforeCommit, so it holds one partition's offsets row locked, and is
// dropped from the group. The member that takes its partitions over
// consumes the other partitions at once, and the locked one once the lock
// is released (here the frozen session is ended, as PostgreSQL does after
// consumer.Config.IdleTxTimeout). When the frozen worker wakes its commit
// fails, its retry is fenced, and every message has exactly one effect.
func TestFrozenWorker(t *testing.T) {
	e := newEnv(t, 4)
	e.produce(0, 100)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	quick := func(c *Config) {
		c.RebalanceTimeout = time.Second
		c.RevokeTimeout = 500 * time.Millisecond
	}
	a := e.source(quick)
	a.cfg.RevokeTimeout = time.Minute // it waits for its batch, and the coordinator drops it
	old, err := a.Fetch(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	l := old.SourceData.(*lane)
	tx, pid := e.freeze(ctx, a, old)
	defer func() { _ = tx.Rollback(context.Background()) }()

	b := e.source(quick)
	wb := startWorkers(ctx, b, e.pool, 2, 50, nil)
	waitFor(t, time.Minute, "the partitions the frozen worker does not hold locked", func() bool {
		return e.effectsOn(l.name, false) >= 75
	})
	if st := e.sessionState(pid); st != "idle in transaction" {
		t.Fatalf("the frozen transaction's session is %q, want idle in transaction: the lock was not held throughout", st)
	}
	if n := e.effectsOn(l.name, true); n != 0 {
		t.Fatalf("%d effects on %s while its row was locked", n, l.name)
	}

	// PostgreSQL ends the frozen session (what IdleTxTimeout makes it do).
	if _, err := e.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	e.waitEffects(100, time.Minute)

	// The frozen worker wakes up: its commit fails, and its retry is fenced.
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("the frozen transaction committed after its session was ended")
	}
	if err := process(ctx, a, e.pool, old, nil); !errors.Is(err, consumer.ErrFenced) {
		t.Fatalf("the frozen worker's retry: got %v, want ErrFenced", err)
	}
	cancel()
	wb.wait(t)
	if rows, distinct := e.effects(); rows != 100 || distinct != 100 {
		t.Fatalf("%d effect rows for %d distinct messages, want 100 of each", rows, distinct)
	}
	if row := e.storedOffsets()[l.partition]; row[0] != 25 || row[1] <= int64(l.gen.id) {
		t.Fatalf("offsets row of %s: %v, want next offset 25 written by a generation after %d", l.name, row, l.gen.id)
	}
}
