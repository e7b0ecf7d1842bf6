package idset_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/dedupetest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newStrategy returns a migrated strategy for cfg on a fresh database.
func newStrategy(t testing.TB, cfg idset.Config) (*idset.Strategy, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.NewPool(t)
	s, err := idset.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if _, err := pg.Migrate(context.Background(), pool, cfg.Schema, s.Migrations()...); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return s, pool
}

func TestConformance(t *testing.T) {
	t.Parallel()
	dedupetest.Run(t, dedupetest.Harness{
		New: func(t *testing.T) (dedupe.Strategy, *pgxpool.Pool) {
			return newStrategy(t, idset.Config{})
		},
		Key: func(scope string, i int) dedupe.Key {
			return dedupe.Key{Scope: scope, ID: fmt.Sprintf("id-%d", i)}
		},
		Fingerprints: true,
	})
}
