package switchover_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/dedupetest"
	"github.com/effectively-once/effectively/dedupe/switchover"
	"github.com/effectively-once/effectively/pgtest"
)

// Both wrappers are strategies like any other: they pass the conformance
// suite, with the old (or shadow) store consulted on every claim.
func TestConformance(t *testing.T) {
	t.Parallel()
	idKey := func(scope string, i int) dedupe.Key { return dedupe.Key{Scope: scope, ID: fmt.Sprintf("id-%d", i)} }
	seqKey := func(scope string, i int) dedupe.Key { return key(scope, "s", i+1) }
	pairs := []struct {
		name     string
		a, b     func(testing.TB) dedupe.Strategy
		key      func(string, int) dedupe.Key
		fps      bool // the Migration (the new strategy decides) detects reuse
		shadowFP bool // the Shadow (the live strategy decides) does
		shadow   bool // run the Shadow too (two pairs cover it: each strategy once live, once shadow)
	}{
		{"idset-bloom", func(t testing.TB) dedupe.Strategy { return newIDSet(t) }, func(t testing.TB) dedupe.Strategy { return newBloom(t) }, idKey, true, true, true},
		{"bloom-idset", func(t testing.TB) dedupe.Strategy { return newBloom(t) }, func(t testing.TB) dedupe.Strategy { return newIDSet(t) }, idKey, true, true, false},
		// highwater keeps only the fingerprint of a sender's last seq, so
		// an older seq reused is a duplicate, not a mismatch: where its
		// verdicts decide, Fingerprints is false, as in its own suite.
		{"idset-highwater", func(t testing.TB) dedupe.Strategy { return newIDSet(t) }, func(t testing.TB) dedupe.Strategy { return newHighwater(t) }, seqKey, false, true, false},
		{"highwater-idset", func(t testing.TB) dedupe.Strategy { return newHighwater(t) }, func(t testing.TB) dedupe.Strategy { return newIDSet(t) }, seqKey, true, false, true},
	}
	for _, p := range pairs {
		t.Run("Migration/"+p.name, func(t *testing.T) {
			t.Parallel()
			dedupetest.Run(t, dedupetest.Harness{
				New: func(t *testing.T) (dedupe.Strategy, *pgxpool.Pool) {
					pool := pgtest.NewPool(t)
					m, err := switchover.New(switchover.Config{Old: p.a(t), New: p.b(t), Until: time.Now().Add(time.Hour)})
					if err != nil {
						t.Fatal(err)
					}
					prepare(t, pool, m.Strategy())
					return m.Strategy(), pool
				},
				Key:          p.key,
				Fingerprints: p.fps,
			})
		})
		if !p.shadow {
			continue
		}
		t.Run("Shadow/"+p.name, func(t *testing.T) {
			t.Parallel()
			dedupetest.Run(t, dedupetest.Harness{
				New: func(t *testing.T) (dedupe.Strategy, *pgxpool.Pool) {
					pool := pgtest.NewPool(t)
					s, err := switchover.NewShadow(switchover.ShadowConfig{Live: p.a(t), Shadow: p.b(t), LogEvery: -1})
					if err != nil {
						t.Fatal(err)
					}
					prepare(t, pool, s.Strategy())
					t.Cleanup(func() {
						if st := s.Stats(); st.Errors > 0 {
							t.Errorf("the shadow strategy failed %d claims, the last with %v", st.Errors, st.LastError)
						}
					})
					return s.Strategy(), pool
				},
				Key:          p.key,
				Fingerprints: p.shadowFP,
			})
		})
	}
}
