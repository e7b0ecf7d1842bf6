package switchover_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/switchover"
	"github.com/effectively-once/effectively/pgtest"
)

// BenchmarkClaim compares, side by side in one run, the claim of a batch
// of 500 new keys (committed) by the strategies alone and through the
// wrappers: a Migration from idset to bloom while it consults the old
// store, and idset live with a bloom shadow. Compare the ns/op ratios, not
// the absolute figures.
func BenchmarkClaim(b *testing.B) {
	const batch = 500
	setups := []struct {
		name string
		make func(b *testing.B) dedupe.Strategy
	}{
		{"idset", func(b *testing.B) dedupe.Strategy { return newIDSet(b) }},
		{"bloom", func(b *testing.B) dedupe.Strategy { return newBloom(b) }},
		{"migration-idset-bloom", func(b *testing.B) dedupe.Strategy {
			m, err := switchover.New(switchover.Config{Old: newIDSet(b), New: newBloom(b), Until: time.Now().Add(time.Hour)})
			if err != nil {
				b.Fatal(err)
			}
			return m.Strategy()
		}},
		{"shadow-idset-bloom", func(b *testing.B) dedupe.Strategy {
			s, err := switchover.NewShadow(switchover.ShadowConfig{Live: newIDSet(b), Shadow: newBloom(b), LogEvery: -1})
			if err != nil {
				b.Fatal(err)
			}
			return s.Strategy()
		}},
	}
	for _, su := range setups {
		b.Run(su.name, func(b *testing.B) {
			pool := pgtest.NewPool(b)
			s := su.make(b)
			prepare(b, pool, s)
			ctx := context.Background()
			n := 0
			keys := make([]dedupe.Key, batch)
			for b.Loop() {
				for i := range keys {
					n++
					keys[i] = dedupe.Key{Scope: "bench", ID: fmt.Sprintf("k-%d", n)}
				}
				tx, err := pool.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				vs, err := s.Claim(ctx, tx, keys)
				if err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(ctx); err != nil {
					b.Fatal(err)
				}
				if c, ok := s.(dedupe.Committer); ok {
					c.Committed(keys, vs)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/key")
		})
	}
}
