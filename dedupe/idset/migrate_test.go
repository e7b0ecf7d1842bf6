package idset_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

// TestMigrateQuotesNames: schema and table names that need quoting work
// everywhere: migrations, claims and the sweeper.
func TestMigrateQuotesNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct{ schema, table string }{
		{"My Schema", `odd"table`},
		{"select", "drop table; --"},
		{"effectively", strings.Repeat("t", 63)}, // the index name needs shortening
		{"effectively", strings.Repeat("t", 62) + "x"},
	} {
		cfg := idset.Config{Schema: tc.schema, Table: tc.table, Retention: time.Hour}
		s, pool := newStrategy(t, cfg)
		table := pgx.Identifier{tc.schema, tc.table}.Sanitize()
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil || !exists {
			t.Fatalf("%s: table missing after Migrate (%v)", table, err)
		}
		var indexes int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = $2`,
			tc.schema, tc.table).Scan(&indexes); err != nil || indexes != 2 {
			t.Errorf("%s: %d indexes (%v), want the primary key and processed_at", table, indexes, err)
		}
		ks := []dedupe.Key{{Scope: "s", ID: "a"}, {Scope: "s", ID: "b"}}
		if vs := claimKeys(t, s, pool, ks); vs[0] != dedupe.VerdictNew || vs[1] != dedupe.VerdictNew {
			t.Errorf("%s: first claim %v, want new", table, vs)
		}
		if vs := claimKeys(t, s, pool, ks); vs[0] != dedupe.VerdictDuplicate || vs[1] != dedupe.VerdictDuplicate {
			t.Errorf("%s: second claim %v, want duplicate", table, vs)
		}
		backdate(t, pool, table, ks[:1], 2*time.Hour)
		if n, err := s.Sweep(ctx, pool); err != nil || n != 1 {
			t.Errorf("%s: Sweep = %d, %v; want 1, nil", table, n, err)
		}
		// Migrating again applies nothing.
		applied, err := pg.Migrate(ctx, pool, tc.schema, s.Migrations()...)
		if err != nil || len(applied) != 0 {
			t.Errorf("%s: second Migrate applied %v, %v; want nothing", table, applied, err)
		}
	}
}

// TestMigrationSQLAppliesByHand: the printed script creates the table, and
// Migrate afterwards has nothing left to do.
func TestMigrationSQLAppliesByHand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s, err := idset.New(idset.Config{Schema: "My Schema", Table: `odd"table`})
	if err != nil {
		t.Fatal(err)
	}
	script, err := pg.MigrationSQL("My Schema", s.Migrations()...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, script); err != nil {
		t.Fatalf("applying the script by hand: %v\n%s", err, script)
	}
	applied, err := pg.Migrate(ctx, pool, "My Schema", s.Migrations()...)
	if err != nil || len(applied) != 0 {
		t.Errorf("Migrate after the script applied %v, %v; want nothing", applied, err)
	}
	ks := []dedupe.Key{{Scope: "s", ID: "a"}}
	if vs := claimKeys(t, s, pool, ks); vs[0] != dedupe.VerdictNew {
		t.Errorf("claim on the hand-made table: %v, want new", vs)
	}
}

// TestMigrateWithOtherLines: the line can be applied together with other
// lines whose migrations table is in another schema (as a consumer does);
// the markers table still lands in the strategy's schema.
func TestMigrateWithOtherLines(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	s, err := idset.New(idset.Config{Schema: "markers"})
	if err != nil {
		t.Fatal(err)
	}
	applied, err := pg.Migrate(ctx, pool, "app", s.Migrations()...)
	if err != nil || len(applied) != 1 {
		t.Fatalf("Migrate = %v, %v; want one migration applied", applied, err)
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('markers.processed') IS NOT NULL`).Scan(&exists); err != nil || !exists {
		t.Fatalf("markers.processed missing (%v)", err)
	}
	if vs := claimKeys(t, s, pool, []dedupe.Key{{Scope: "s", ID: "a"}}); vs[0] != dedupe.VerdictNew {
		t.Errorf("claim: %v, want new", vs)
	}
	if applied, err := pg.Migrate(ctx, pool, "app", s.Migrations()...); err != nil || len(applied) != 0 {
		t.Errorf("second Migrate applied %v, %v; want nothing", applied, err)
	}
}
