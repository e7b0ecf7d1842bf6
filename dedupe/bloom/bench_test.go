package bloom_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/pg"
)

// BenchmarkClaim claims batches of 500 new keys against a table whose seven
// closed one-hour slices hold 50,000 markers each, with the filters warm
// ("filter") and with them disabled, so that every key is probed in every
// live partition ("probing"). It reports keys/s, the measured
// false-positive rate and the probes per key.
func BenchmarkClaim(b *testing.B) {
	const (
		batch    = 500
		slices   = 7
		perSlice = 50_000
	)
	cfg := bloom.Config{Slice: time.Hour, Retention: slices * time.Hour}
	pool := pgtestPool(b)
	ctx := context.Background()
	m, err := bloom.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pg.Migrate(ctx, pool, "", m.Migrations()...); err != nil {
		b.Fatal(err)
	}

	// Partitions and markers for the closed slices, as earlier hours of
	// traffic would have left them.
	var now time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		b.Fatal(err)
	}
	parent := pgx.Identifier{pg.DefaultSchema, bloom.DefaultTable}.Sanitize()
	for i := 1; i <= slices; i++ {
		start := now.Truncate(time.Hour).Add(-time.Duration(i) * time.Hour).UTC()
		name := pgx.Identifier{pg.DefaultSchema, bloom.DefaultTable + "_" + start.Format("20060102t150405")}.Sanitize()
		sql := fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
			name, parent, start.Format(time.RFC3339), start.Add(time.Hour).Format(time.RFC3339))
		if _, err := pool.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `INSERT INTO `+parent+` (scope, id, slice, claim_version)
SELECT 'bench', 'old-' || $1::int || '-' || g, $2, 2 FROM generate_series(1, $3::int) AS g`, i, start, perSlice); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+parent); err != nil {
		b.Fatal(err)
	}
	s := open(b, pool, cfg)
	if err := s.Warm(ctx, pool); err != nil {
		b.Fatal(err)
	}
	cfg.DisableFilter = true
	probing := open(b, pool, cfg)

	next := 0
	for _, bc := range []struct {
		name string
		s    *bloom.Strategy
	}{{"filter", s}, {"probing", probing}} {
		b.Run(bc.name, func(b *testing.B) {
			st0 := bc.s.Stats()
			begin := time.Now()
			for b.Loop() {
				keys := make([]dedupe.Key, batch)
				for i := range keys {
					keys[i] = dedupe.Key{Scope: "bench", ID: fmt.Sprintf("new-%d", next)}
					next++
				}
				var vs []dedupe.Verdict
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					var err error
					vs, err = bc.s.Claim(ctx, tx, keys)
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
				bc.s.Committed(keys, vs)
			}
			elapsed := time.Since(begin)
			st := bc.s.Stats()
			keys := float64(st.Keys - st0.Keys)
			b.ReportMetric(keys/elapsed.Seconds(), "keys/s")
			b.ReportMetric(float64(st.Probes-st0.Probes)/keys, "probes/key")
			if st.SealedKeys > 0 {
				b.ReportMetric(float64(st.SealedBytes)/float64(st.SealedKeys), "filter-B/key")
			}
			if tests := st.Tests - st0.Tests; tests > 0 {
				b.ReportMetric(float64(st.FalsePositives-st0.FalsePositives)/float64(tests), "fp-rate")
			}
		})
	}
}
