package bloom_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/pg"
)

func TestNewThenDuplicateAndMismatch(t *testing.T) {
	t.Parallel()
	s, pool := setup(t, bloom.Config{})
	ks := keyRange("a", 0, 10)
	expectAll(t, "first claim", claim(t, s, pool, ks), dedupe.VerdictNew)
	expectAll(t, "second claim", claim(t, s, pool, ks), dedupe.VerdictDuplicate)

	fp := dedupe.Key{Scope: "a", ID: "fp", Fingerprint: dedupe.Fingerprint([]byte("one"))}
	other := fp
	other.Fingerprint = dedupe.Fingerprint([]byte("two"))
	got := claim(t, s, pool, []dedupe.Key{fp, fp, other})
	want := []dedupe.Verdict{dedupe.VerdictNew, dedupe.VerdictDuplicate, dedupe.VerdictMismatch}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("repeats in a batch: got %v, want %v", got, want)
		}
	}
	got = claim(t, s, pool, []dedupe.Key{other, fp, {Scope: "a", ID: "fp"}})
	want = []dedupe.Verdict{dedupe.VerdictMismatch, dedupe.VerdictDuplicate, dedupe.VerdictDuplicate}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("against the stored marker: got %v, want %v", got, want)
		}
	}
	if n := markers(t, pool, bloom.DefaultTable); n != 11 {
		t.Fatalf("%d markers, want 11", n)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]bloom.Config{
		"retention not over slice": {Slice: time.Hour, Retention: time.Hour},
		"fractional slice":         {Slice: 1500 * time.Millisecond},
		"tiny slice":               {Slice: time.Millisecond},
		"fp rate":                  {FalsePositiveRate: 0.7},
		"negative keys":            {ExpectedKeysPerSlice: -1},
		"negative ahead":           {PartitionsAhead: -1},
		"long table":               {Table: strings.Repeat("t", 48)},
		"nul in schema":            {Schema: "a\x00b"},
	} {
		_, err := bloom.New(cfg)
		var ce *pg.ConfigError
		if !errors.Is(err, pg.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Package != "bloom" {
			t.Errorf("%s: New returned %v, want a bloom ConfigError", name, err)
		}
	}
	if _, err := bloom.New(bloom.Config{Table: strings.Repeat("t", 47)}); err != nil {
		t.Errorf("a 47-byte table name: %v", err)
	}
}

func TestInvalidKeys(t *testing.T) {
	t.Parallel()
	s, pool := setup(t, bloom.Config{})
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	_, err = s.Claim(ctx, tx, []dedupe.Key{keyOf("a", 1), {Scope: "a"}})
	var ke *dedupe.KeyError
	if !errors.As(err, &ke) || ke.Key.ID != "" {
		t.Fatalf("empty ID: got %v, want a KeyError naming it", err)
	}
}

func TestRefusesRepeatableRead(t *testing.T) {
	t.Parallel()
	s, pool := setup(t, bloom.Config{})
	ctx := context.Background()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := s.Claim(ctx, tx, keyRange("a", 0, 3)); !errors.Is(err, bloom.ErrIsolation) {
		t.Fatalf("got %v, want ErrIsolation", err)
	}
}

func TestQuotedIdentifiers(t *testing.T) {
	t.Parallel()
	cfg := bloom.Config{Schema: `odd "schema"`, Table: `Marks; DROP`}
	s, pool := setup(t, cfg)
	expectAll(t, "first", claim(t, s, pool, keyRange("a", 0, 5)), dedupe.VerdictNew)
	expectAll(t, "again", claim(t, s, pool, keyRange("a", 0, 5)), dedupe.VerdictDuplicate)
	if err := s.Warm(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
}

// TestPreviousClaimFails checks the upgrade fence of migration 002: once
// it is applied, an insert in the shape of a claim that takes per-key locks
// instead of the barrier fails with a not-null violation, so such a process
// cannot write a marker the barrier does not serialise, while Claim works.
func TestPreviousClaimFails(t *testing.T) {
	t.Parallel()
	s, pool := setup(t, bloom.Config{})
	ctx := context.Background()
	parent := pgx.Identifier{pg.DefaultSchema, bloom.DefaultTable}.Sanitize()
	var now time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	now = now.Truncate(time.Hour).UTC() // the current slice, whose partition Maintain created
	// The insert of the previous claim statement, into the parent table.
	_, err := pool.Exec(ctx, `INSERT INTO `+parent+` (scope, id, slice, fingerprint)
    SELECT k.scope, k.id, $3::timestamptz, k.fingerprint
    FROM unnest($1::text[], $2::text[], $4::bytea[]) AS k(scope, id, fingerprint)
    ON CONFLICT DO NOTHING
    RETURNING scope, id`, []string{"old"}, []string{"k"}, now, [][]byte{nil})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23502" {
		t.Fatalf("previous claim's insert: got %v, want a not-null violation (23502)", err)
	}
	if n := markers(t, pool, bloom.DefaultTable); n != 0 {
		t.Fatalf("%d markers after the failed insert, want 0", n)
	}
	ks := []dedupe.Key{{Scope: "old", ID: "k"}}
	expectAll(t, "claim", claim(t, s, pool, ks), dedupe.VerdictNew)
	expectAll(t, "claim again", claim(t, s, pool, ks), dedupe.VerdictDuplicate)
}
