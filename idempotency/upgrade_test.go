package idempotency_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

// migrateMarkers creates the markers table of DefaultStrategy, as a
// deployment of a version that claimed keys by markers has it.
func migrateMarkers(t testing.TB, pool *pgxpool.Pool) dedupe.Strategy {
	t.Helper()
	s, err := idempotency.DefaultStrategy()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Migrate(context.Background(), pool, "", s.(dedupe.Migrator).Migrations()...); err != nil {
		t.Fatal(err)
	}
	return s
}

// rows returns the number of rows in every table of the database but
// payments: what the middleware and its migrations keep.
func rows(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT coalesce(sum((xpath('/row/c/text()',
    query_to_xml(format('SELECT count(*) AS c FROM %I.%I', schemaname, relname), false, true, '')))[1]::text::int), 0)
FROM pg_stat_user_tables WHERE relname <> 'payments'`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestOneRowPerKey: a key costs the middleware one row, its stored
// response, which is also its claim: no marker besides it.
func TestOneRowPerKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true}, nil)
	before := rows(t, e.pool)
	wantStatus(t, e.post(t, "k1", `{"amount":5,"to":"x"}`), http.StatusCreated)
	wantStatus(t, e.post(t, "k1", `{"amount":5,"to":"x"}`), http.StatusCreated)
	wantStatus(t, e.post(t, "k1", `{"amount":6,"to":"x"}`), http.StatusUnprocessableEntity)
	if n := rows(t, e.pool) - before; n != 1 {
		t.Fatalf("the middleware keeps %d rows for one key, want 1 (its stored response)", n)
	}
	if n := e.count(t, "true"); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}

// TestUpgradeFromMarkers: keys completed by a version that claimed them by
// an idset marker (a marker and a response row each) are replayed, and a
// key reused with another body is refused, by a middleware without a
// strategy; and with Config.Strategy set to DefaultStrategy, as during a
// rolling upgrade, a middleware both finds the keys the strategy-less one
// completed (which have no marker) and leaves a marker for each key it
// completes, which an instance of the older version looks for.
func TestUpgradeFromMarkers(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	s := migrateMarkers(t, pool)
	bridge := newEnvPool(t, pool, idempotency.Config{SingleTenant: true, Strategy: s}, nil)
	mw, err := idempotency.New(pool, idempotency.Config{SingleTenant: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	plain := &env{pool: pool, mw: mw, srv: httptest.NewServer(mw.Wrap(http.HandlerFunc(paymentsHandler)))}
	t.Cleanup(plain.srv.Close)

	first := bridge.post(t, "old", `{"amount":5,"to":"x"}`)
	wantStatus(t, first, http.StatusCreated)
	if n := bridge.markers(t); n != 1 {
		t.Fatalf("%d markers after a key completed with the strategy, want 1", n)
	}
	again := plain.post(t, "old", `{"amount":5,"to":"x"}`)
	if again.status != http.StatusCreated || again.header.Get(idempotency.ReplayedHeader) != "true" || string(again.body) != string(first.body) {
		t.Fatalf("a key completed with markers answered %d %s (replayed %q)", again.status, again.body, again.header.Get(idempotency.ReplayedHeader))
	}
	wantStatus(t, plain.post(t, "old", `{"amount":6,"to":"x"}`), http.StatusUnprocessableEntity)

	wantStatus(t, plain.post(t, "new", `{"amount":7,"to":"y"}`), http.StatusCreated)
	r := bridge.post(t, "new", `{"amount":7,"to":"y"}`)
	if r.status != http.StatusCreated || r.header.Get(idempotency.ReplayedHeader) != "true" {
		t.Fatalf("a key completed without a strategy answered %d %s through the strategy (not replayed)", r.status, r.body)
	}
	if n := plain.count(t, "true"); n != 2 {
		t.Fatalf("%d payments, want 2", n)
	}
}
