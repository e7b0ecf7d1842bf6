package dedupe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
)

// Inspector is implemented by strategies that describe and sweep their own
// stored markers. Operations tools use only this to report and expire
// markers (the CLI's stats and sweep commands), so a strategy that
// implements it works there without changes to the tool.
type Inspector interface {
	// MarkerStats reports the strategy's tables and, per scope, its
	// markers; only scope's when scope is not empty. A table that does not
	// exist yet is reported with Exists false, not as an error.
	MarkerStats(ctx context.Context, db pg.DB, scope string) (MarkerStats, error)
	// SweepExpired removes the markers past the strategy's retention, or,
	// with dryRun, removes nothing and says what it would remove. It is
	// safe while consumers run. A strategy whose markers do not expire
	// returns an error wrapping ErrNoSweep.
	SweepExpired(ctx context.Context, db pg.DB, dryRun bool) (SweepReport, error)
}

// ErrNoSweep is returned by Inspector.SweepExpired of a strategy whose
// markers do not expire.
var ErrNoSweep = errors.New("dedupe: the strategy's markers do not expire")

// MarkerStats describes a strategy's stored markers.
type MarkerStats struct {
	// Strategy is the strategy's Name.
	Strategy string
	// Table is the markers table, as schema.table, unquoted.
	Table string
	// Tables are the strategy's tables, the markers table first.
	Tables []TableSize
	// Scopes describe the markers of each scope, ordered by scope.
	Scopes []ScopeMarkers
	// Details are strategy-specific facts (mode, retention, partitions),
	// by name, for people to read.
	Details map[string]string
}

// ScopeMarkers describes the markers of one scope.
type ScopeMarkers struct {
	Scope string
	// Markers counts the scope's marker rows: one per key for an ID set,
	// one per sender for a sequence strategy.
	Markers int64
	// Oldest and Newest are when the oldest and the newest markers were
	// written (or, for a strategy that keeps only a time slice, the slice's
	// start); nil when unknown.
	Oldest, Newest *time.Time
}

// TableSize is one table's size on disk, indexes and partitions included.
type TableSize struct {
	// Table is the table's quoted name, schema.table.
	Table  string
	Exists bool
	Bytes  int64
}

// SweepReport is what Inspector.SweepExpired removed, or would remove.
type SweepReport struct {
	// Table is the markers table, as schema.table, unquoted.
	Table string
	// Retention is the age past which markers are removed.
	Retention time.Duration
	// Removed counts what was removed, or in a dry run what would be, in
	// Units.
	Removed int64
	// Unit is what Removed counts: "marker" or "partition".
	Unit string
	// Nothing is true, in a dry run, when the sweep would change nothing.
	Nothing bool
	// Summary is one line for a person: what the sweep did or, in a dry
	// run, what it will do (phrased as a question's body, such as "Delete
	// about 12 marker(s) older than 240h0m0s from effectively.processed").
	Summary string
}

// SizeOf returns the size on disk of table (a quoted name, such as
// pgx.Identifier{schema, table}.Sanitize()), its indexes and partitions
// included, and whether it exists. q is a *pgxpool.Pool, *pgx.Conn or
// pgx.Tx.
func SizeOf(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, table string) (TableSize, error) {
	ts := TableSize{Table: table}
	err := q.QueryRow(ctx, `SELECT r IS NOT NULL, coalesce(
    (SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(r) WHERE isleaf),
    pg_total_relation_size(r), 0)::bigint
FROM to_regclass($1) AS r`, table).Scan(&ts.Exists, &ts.Bytes)
	if err != nil {
		return ts, fmt.Errorf("dedupe: size of %s: %w", table, err)
	}
	return ts, nil
}

// ScopeStats counts, in tx, the rows of the markers table (a quoted name)
// per scope (only scope's when not empty), with the oldest and newest
// values of the timestamp column col. It is the usual body of
// Inspector.MarkerStats for a table with a scope column.
func ScopeStats(ctx context.Context, tx pgx.Tx, table, col, scope string) ([]ScopeMarkers, error) {
	c := pgx.Identifier{col}.Sanitize()
	rows, err := tx.Query(ctx, `SELECT scope, count(*), min(`+c+`), max(`+c+`) FROM `+table+`
WHERE $1 = '' OR scope = $1 GROUP BY scope ORDER BY scope`, scope)
	if err != nil {
		return nil, fmt.Errorf("dedupe: markers of %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ScopeMarkers])
	if err != nil {
		return nil, fmt.Errorf("dedupe: markers of %s: %w", table, err)
	}
	return out, nil
}
