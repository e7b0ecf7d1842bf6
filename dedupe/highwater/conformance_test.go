package highwater_test

import (
	"context"
	"testing"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/dedupetest"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestConformance runs the dedupe conformance suite in both modes, with and
// without the cache. Key i of a scope is seq i+1 of sender "s". Only the
// fingerprint of a sender's last seq is kept, so a reused older seq is a
// duplicate, not a mismatch: Fingerprints is false.
func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  highwater.Config
	}{
		{"strict", highwater.Config{}},
		{"strict-no-cache", highwater.Config{CacheSize: -1}},
		{"monotonic", highwater.Config{Mode: highwater.Monotonic}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dedupetest.Run(t, dedupetest.Harness{
				New: func(t *testing.T) (dedupe.Strategy, *pgxpool.Pool) {
					pool := pgtest.NewPool(t)
					s, err := highwater.New(tc.cfg)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := pg.Migrate(context.Background(), pool, "", s.Migrations()...); err != nil {
						t.Fatal(err)
					}
					return s, pool
				},
				Key: func(scope string, i int) dedupe.Key {
					return dedupe.Key{Scope: scope, Sender: "s", Seq: int64(i) + 1}
				},
				Fingerprints: false,
			})
		})
	}
}
