package idset

import (
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Strategy is the processed-ID dedupe strategy. It is safe for concurrent
// use by several transactions.
type Strategy struct {
	cfg   Config
	log   *slog.Logger
	index string // name of the processed_at index, unquoted

	claimSQL string // the one statement of a claim
	fetchSQL string // reads markers committed concurrently with a claim
	sweepSQL string // deletes one batch of expired markers
}

var (
	_ dedupe.Strategy   = (*Strategy)(nil)
	_ dedupe.Retainer   = (*Strategy)(nil)
	_ dedupe.Migrator   = (*Strategy)(nil)
	_ dedupe.Maintainer = (*Strategy)(nil) // consumers run the sweeper through it
)

// New returns a Strategy for cfg, after filling in defaults and validating
// it. The error wraps pg.ErrInvalidConfig for a bad value. When
// cfg.RedeliveryHorizon is set and the retention is shorter, New logs a
// warning naming both.
func New(cfg Config) (*Strategy, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Strategy{cfg: cfg, log: cfg.Logger, index: indexName(cfg.Table, "_processed_at_idx")}
	table := pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()
	s.claimSQL = claimSQL(table)
	s.fetchSQL = fetchSQL(table)
	s.sweepSQL = sweepSQL(table)
	if cfg.RedeliveryHorizon > 0 && cfg.Retention < cfg.RedeliveryHorizon {
		s.log.Warn("idset: retention is shorter than the redelivery horizon: a message redelivered after its marker expired is applied again",
			"table", cfg.Schema+"."+cfg.Table,
			"retention", cfg.Retention,
			"redelivery_horizon", cfg.RedeliveryHorizon)
	}
	return s, nil
}

// Name returns "idset".
func (s *Strategy) Name() string { return "idset" }

// Retention returns how long markers are kept (dedupe.Retainer).
func (s *Strategy) Retention() time.Duration { return s.cfg.Retention }

// Migrations returns the migration line that creates the markers table
// (dedupe.Migrator), for pg.Migrate and pg.MigrationSQL (a
// consumer's Migrate applies it). The line always creates its table in the
// configured Schema, whichever schema holds the migrations table.
func (s *Strategy) Migrations() []pg.Line {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the embedded directory always exists
	}
	return []pg.Line{{
		Name: "idset:" + s.cfg.Schema + "." + s.cfg.Table,
		FS:   sub,
		Idents: map[string]string{
			"schema":           s.cfg.Schema,
			"table":            s.cfg.Table,
			"processed_at_idx": s.index,
		},
	}}
}

// indexName returns table+suffix, shortened with a hash of table when it
// would exceed PostgreSQL's identifier limit (which would otherwise
// truncate it silently, so that two long table names could collide).
func indexName(table, suffix string) string {
	if len(table)+len(suffix) <= pg.MaxIdentifierLen {
		return table + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(table))
	tag := fmt.Sprintf("_%08x", h.Sum32())
	keep := pg.MaxIdentifierLen - len(suffix) - len(tag)
	for keep > 0 && !utf8.RuneStart(table[keep]) {
		keep--
	}
	return table[:keep] + tag + suffix
}
