package idempotency_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/pgtest"
)

// TestExecModes: the request's transaction, begun with the claim in one
// pipeline, works in every pgx query mode (PgBouncer setups use exec or
// the simple protocol): a first request, its replay, a refused write, and
// a retry while the lock is held.
func TestExecModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			e := newEnvPool(t, pool, idempotency.Config{SingleTenant: true}, nil)
			body := `{"amount":5,"to":"x"}`
			first := e.post(t, "k1", body)
			wantStatus(t, first, http.StatusCreated)
			again := e.post(t, "k1", body)
			if string(again.body) != string(first.body) || again.header.Get(idempotency.ReplayedHeader) != "true" {
				t.Fatalf("replay %d %s", again.status, again.body)
			}
			wantStatus(t, e.post(t, "k1", `{"amount":6,"to":"x"}`), http.StatusUnprocessableEntity)
			ctx := context.Background()
			holder, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback(ctx)
			if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, idempotency.LockKey(idempotency.DefaultName, "k2")); err != nil {
				t.Fatal(err)
			}
			wantStatus(t, e.post(t, "k2", body), http.StatusConflict)
			_ = holder.Rollback(ctx)
			wantStatus(t, e.post(t, "k2", body), http.StatusCreated)
			if n := e.count(t, "true"); n != 2 {
				t.Fatalf("%d payments, want 2", n)
			}
		})
	}
}
