package expiry

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe/bloom"
)

// Scope is the scope of every key the benchmark claims or loads.
const Scope = "bench"

// spreadSeconds bounds the offset of a loaded idset marker within its day,
// so that the last hour of every slice holds no marker and the sweep's
// threshold (which moves with the clock while it runs) separates slices
// cleanly.
const spreadSeconds = 23 * 3600

// loadedID is the SQL expression for the id of loaded marker g: 32 hex
// digits, like a UUID, so that new keys land all over idset's index.
const loadedID = `md5('m' || g)`

// loadedFP is the SQL expression for the fingerprint of loaded marker g
// (16 bytes, as dedupe.Fingerprint).
const loadedFP = `decode(md5('f' || g), 'hex')`

// sliceRange is the range of generate_series values loaded into slice j
// (1 is the newest closed slice, Slices the oldest).
func (r *runner) sliceRange(j int) (lo, hi int) {
	per := r.cfg.Markers / r.cfg.Slices
	lo = (j-1)*per + 1
	hi = j * per
	if j == r.cfg.Slices {
		hi = r.cfg.Markers
	}
	return lo, hi
}

// sliceStart returns the start of the closed slice j slices before the
// current one.
func (r *runner) sliceStart(j int) time.Time {
	return r.current.Add(-time.Duration(j) * slice)
}

// loadIdset fills idset's table with Markers markers, their processed_at
// spread over the closed slices. The indexes are dropped first and built
// again after the rows are in, as a bulk load would do; their definitions
// are read from the catalog, so the table ends up as its migration made
// it.
func (r *runner) loadIdset(ctx context.Context, pool *pgxpool.Pool) error {
	table := pgx.Identifier{r.cfg.Schema, idsetTable}.Sanitize()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL maintenance_work_mem = '512MB'`); err != nil {
			return err
		}
		var pkName, pkDef string
		if err := tx.QueryRow(ctx, `SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = $1::regclass AND contype = 'p'`, table).Scan(&pkName, &pkDef); err != nil {
			return fmt.Errorf("reading the primary key: %w", err)
		}
		var idxNames, idxDefs []string
		rows, err := tx.Query(ctx, `SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = $1::regclass AND NOT i.indisprimary`, table)
		if err != nil {
			return err
		}
		for rows.Next() {
			var n, d string
			if err := rows.Scan(&n, &d); err != nil {
				rows.Close()
				return err
			}
			idxNames, idxDefs = append(idxNames, n), append(idxDefs, d)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		pk := pgx.Identifier{pkName}.Sanitize()
		if _, err := tx.Exec(ctx, `ALTER TABLE `+table+` DROP CONSTRAINT `+pk); err != nil {
			return err
		}
		for _, n := range idxNames {
			if _, err := tx.Exec(ctx, `DROP INDEX `+pgx.Identifier{r.cfg.Schema, n}.Sanitize()); err != nil {
				return err
			}
		}
		for j := 1; j <= r.cfg.Slices; j++ {
			lo, hi := r.sliceRange(j)
			if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (scope, id, fingerprint, processed_at)
SELECT $1, `+loadedID+`, `+loadedFP+`, $2::timestamptz + ((g::bigint * 7919) % $5) * interval '1 second'
FROM generate_series($3::int, $4::int) AS g`, Scope, r.sliceStart(j), lo, hi, spreadSeconds); err != nil {
				return fmt.Errorf("loading slice %d: %w", j, err)
			}
		}
		if _, err := tx.Exec(ctx, `ALTER TABLE `+table+` ADD CONSTRAINT `+pk+` `+pkDef); err != nil {
			return err
		}
		for _, d := range idxDefs {
			if _, err := tx.Exec(ctx, d); err != nil {
				return err
			}
		}
		return nil
	})
}

// loadBloom creates one partition per closed slice, named as the strategy
// names them, and fills it with that slice's markers. Each partition is
// loaded as a plain table, given its primary key and a CHECK constraint
// matching its bounds, and then attached, so that the attach neither
// rebuilds the index nor scans the rows.
func (r *runner) loadBloom(ctx context.Context, pool *pgxpool.Pool) error {
	parent := pgx.Identifier{r.cfg.Schema, bloom.DefaultTable}.Sanitize()
	for j := 1; j <= r.cfg.Slices; j++ {
		start := r.sliceStart(j)
		lo, hi := r.sliceRange(j)
		name := pgx.Identifier{r.cfg.Schema, bloom.DefaultTable + "_" + start.UTC().Format("20060102t150405")}.Sanitize()
		// The bounds are formatted from time values, never from input.
		from, to := start.Format(time.RFC3339), start.Add(slice).Format(time.RFC3339)
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, q := range []string{
				`SET LOCAL maintenance_work_mem = '256MB'`,
				`CREATE TABLE ` + name + ` (LIKE ` + parent + `)`,
			} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+name+` (scope, id, slice, fingerprint, claim_version)
SELECT $1, `+loadedID+`, $2::timestamptz, `+loadedFP+`, 2
FROM generate_series($3::int, $4::int) AS g`, Scope, start, lo, hi); err != nil {
				return err
			}
			for _, q := range []string{
				`ALTER TABLE ` + name + ` ADD PRIMARY KEY (scope, id, slice)`,
				fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT bounds CHECK (slice >= '%s' AND slice < '%s')`, name, from, to),
				fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`, parent, name, from, to),
				`ALTER TABLE ` + name + ` DROP CONSTRAINT bounds`,
			} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("loading slice %d: %w", j, err)
		}
	}
	return nil
}
