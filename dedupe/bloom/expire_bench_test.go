package bloom_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/pg"
)

// BenchmarkExpireSlice compares the cost of expiring one slice of 100,000
// markers: Maintain dropping the slice's partition ("drop-partition")
// against deleting the same rows, 1,000 at a time, from a table shaped like
// a processed-ID table with an index on its timestamp ("delete-rows"). It
// reports the wall time and the WAL written per expiry (ms/expiry,
// WAL-B/expiry); ns/op includes loading the 100,000 markers each time, so
// that the benchmark's run time stays bounded.
func BenchmarkExpireSlice(b *testing.B) {
	const rows = 100_000
	ctx := context.Background()
	walBytes := func(pool *pgxpool.Pool, f func()) float64 {
		var before, after string
		if err := pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&before); err != nil {
			b.Fatal(err)
		}
		f()
		var n float64
		if err := pool.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&after); err != nil {
			b.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)`, after, before).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}

	b.Run("drop-partition", func(b *testing.B) {
		cfg := bloom.Config{Slice: time.Hour, Retention: 2 * time.Hour}
		s, pool := setup(b, cfg)
		parent := pgx.Identifier{pg.DefaultSchema, bloom.DefaultTable}.Sanitize()
		var wal, took float64
		for i := 0; b.Loop(); i++ {
			start := time.Now().Truncate(time.Hour).Add(-time.Duration(3+i) * time.Hour).UTC()
			name := pgx.Identifier{pg.DefaultSchema, bloom.DefaultTable + "_" + start.Format("20060102t150405")}.Sanitize()
			if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
				name, parent, start.Format(time.RFC3339), start.Add(time.Hour).Format(time.RFC3339))); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `INSERT INTO `+parent+` (scope, id, slice, claim_version) SELECT 'x', 'k-' || g, $1, 2 FROM generate_series(1, $2::int) g`, start, rows); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
				b.Fatal(err)
			}
			begin := time.Now()
			wal += walBytes(pool, func() {
				if err := s.Maintain(ctx, pool); err != nil {
					b.Fatal(err)
				}
			})
			took += time.Since(begin).Seconds()
			if n := markers(b, pool, bloom.DefaultTable); n != 0 {
				b.Fatalf("%d markers left after the drop", n)
			}
		}
		b.ReportMetric(took/float64(b.N)*1000, "ms/expiry")
		b.ReportMetric(wal/float64(b.N), "WAL-B/expiry")
	})

	b.Run("delete-rows", func(b *testing.B) {
		pool := pgtestPool(b)
		if _, err := pool.Exec(ctx, `CREATE TABLE processed (
    scope text NOT NULL, id text NOT NULL, fingerprint bytea,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, id));
CREATE INDEX ON processed (processed_at)`); err != nil {
			b.Fatal(err)
		}
		var wal, took float64
		for i := 0; b.Loop(); i++ {
			if _, err := pool.Exec(ctx, `INSERT INTO processed (scope, id, processed_at)
SELECT 'x', 'k-' || $1::int || '-' || g, now() - interval '3 hours' FROM generate_series(1, $2::int) g`, i, rows); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
				b.Fatal(err)
			}
			begin := time.Now()
			wal += walBytes(pool, func() {
				for {
					tag, err := pool.Exec(ctx, `DELETE FROM processed WHERE ctid IN (
    SELECT ctid FROM processed WHERE processed_at < now() - interval '2 hours' LIMIT 1000)`)
					if err != nil {
						b.Fatal(err)
					}
					if tag.RowsAffected() == 0 {
						break
					}
				}
			})
			took += time.Since(begin).Seconds()
		}
		b.ReportMetric(took/float64(b.N)*1000, "ms/expiry")
		b.ReportMetric(wal/float64(b.N), "WAL-B/expiry")
	})
}
