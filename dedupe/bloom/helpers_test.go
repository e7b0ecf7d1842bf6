package bloom_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// pgtestPool is pgtest.NewPool.
var pgtestPool = pgtest.NewPool

// setup returns a strategy whose table is migrated and whose partitions
// exist, on a fresh database.
func setup(t testing.TB, cfg bloom.Config) (*bloom.Strategy, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.NewPool(t)
	return open(t, pool, cfg), pool
}

// open returns a new strategy on pool, migrated and maintained.
func open(t testing.TB, pool *pgxpool.Pool, cfg bloom.Config) *bloom.Strategy {
	t.Helper()
	s, err := bloom.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := pg.Migrate(ctx, pool, cfg.Schema, s.Migrations()...); err != nil {
		t.Fatal(err)
	}
	if err := s.Maintain(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return s
}

func keyOf(scope string, i int) dedupe.Key {
	return dedupe.Key{Scope: scope, ID: fmt.Sprintf("msg-%08d", i)}
}

func keyRange(scope string, from, to int) []dedupe.Key {
	ks := make([]dedupe.Key, 0, to-from)
	for i := from; i < to; i++ {
		ks = append(ks, keyOf(scope, i))
	}
	return ks
}

// claim claims keys in a transaction of its own, commits it and reports
// the commit to the strategy.
func claim(t testing.TB, s *bloom.Strategy, pool *pgxpool.Pool, keys []dedupe.Key) []dedupe.Verdict {
	t.Helper()
	ctx := context.Background()
	var vs []dedupe.Verdict
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		vs, err = s.Claim(ctx, tx, keys)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Committed(keys, vs)
	return vs
}

// claimAll claims keys in batches of size n.
func claimAll(t testing.TB, s *bloom.Strategy, pool *pgxpool.Pool, keys []dedupe.Key, n int) []dedupe.Verdict {
	t.Helper()
	var out []dedupe.Verdict
	for len(keys) > 0 {
		b := keys[:min(n, len(keys))]
		keys = keys[len(b):]
		out = append(out, claim(t, s, pool, b)...)
	}
	return out
}

// expectAll fails unless every verdict is want.
func expectAll(t testing.TB, what string, vs []dedupe.Verdict, want dedupe.Verdict) {
	t.Helper()
	bad := 0
	for _, v := range vs {
		if v != want {
			bad++
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d verdicts are not %v", what, bad, len(vs), want)
	}
}

// markers counts the markers in the table.
func markers(t testing.TB, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	q := `SELECT count(*) FROM ` + pgx.Identifier{pg.DefaultSchema, table}.Sanitize()
	if err := pool.QueryRow(context.Background(), q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// partitionCount counts the partitions attached to the table.
func partitionCount(t testing.TB, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass($1)`,
		pgx.Identifier{pg.DefaultSchema, table}.Sanitize()).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitForNextSlice sleeps until just after the next boundary of slice.
func waitForNextSlice(slice time.Duration) {
	now := time.Now()
	time.Sleep(now.Truncate(slice).Add(slice).Sub(now) + 20*time.Millisecond)
}

// waitEarlyInSlice returns at once when less than 40% of the current slice
// has passed, and otherwise sleeps until the next slice begins, so that a
// short sequence of claims stays within one slice.
func waitEarlyInSlice(slice time.Duration) {
	now := time.Now()
	if now.Sub(now.Truncate(slice)) > slice*4/10 {
		waitForNextSlice(slice)
	}
}
