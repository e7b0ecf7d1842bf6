package switchover_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The strategies the tests switch between, each in tables of its own.
func newIDSet(t testing.TB) *idset.Strategy {
	t.Helper()
	s, err := idset.New(idset.Config{Table: "old_processed", Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newBloom(t testing.TB) *bloom.Strategy {
	t.Helper()
	// An hour of one-minute slices: the default week would be 10,000
	// partitions.
	s, err := bloom.New(bloom.Config{Slice: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newHighwater(t testing.TB) *highwater.Strategy {
	t.Helper()
	s, err := highwater.New(highwater.Config{Mode: highwater.Monotonic})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// prepare migrates s's tables on pool and runs its Maintain, as a
// consumer's Migrate and Run would.
func prepare(t testing.TB, pool *pgxpool.Pool, s dedupe.Strategy) {
	t.Helper()
	ctx := context.Background()
	if m, ok := s.(dedupe.Migrator); ok {
		if _, err := pg.Migrate(ctx, pool, "", m.Migrations()...); err != nil {
			t.Fatal(err)
		}
	}
	if m, ok := s.(dedupe.Maintainer); ok {
		if err := m.Maintain(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
}

// claim claims keys with s in a transaction of its own, commits it and
// reports the commit, as the consumer does.
func claim(t testing.TB, pool *pgxpool.Pool, s dedupe.Strategy, keys ...dedupe.Key) []dedupe.Verdict {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	vs, err := s.Claim(ctx, tx, keys)
	if err != nil {
		t.Fatalf("Claim(%v): %v", keys, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if c, ok := s.(dedupe.Committer); ok {
		c.Committed(keys, vs)
	}
	return vs
}

// key is message i of sender s: an ID for the ID strategies, a sender and
// sequence number for highwater.
func key(scope, sender string, i int) dedupe.Key {
	return dedupe.Key{Scope: scope, ID: fmt.Sprintf("%s-%d", sender, i), Sender: sender, Seq: int64(i)}
}

func verdicts(vs ...dedupe.Verdict) string { return fmt.Sprint(vs) }

const (
	vNew = dedupe.VerdictNew
	vDup = dedupe.VerdictDuplicate
	vMis = dedupe.VerdictMismatch
	vGap = dedupe.VerdictGap
)
