package idset

import (
	"log/slog"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/internal/logx"
	"github.com/effectively-once/effectively/pg"
)

// Defaults of the Config fields.
const (
	DefaultTable         = "processed"
	DefaultRetention     = 7 * 24 * time.Hour
	DefaultSweepBatch    = 1000
	DefaultSweepInterval = time.Minute
)

// MaxMaxIDLen is the largest MaxIDLen accepted: with scope and ID both at
// most this long, a key still fits in a PostgreSQL B-tree index entry.
const MaxMaxIDLen = 1024

// Config configures a Strategy. The zero value is usable.
type Config struct {
	// Schema is the schema that holds the markers table; it is created by
	// the migrations when missing. Defaults to "effectively".
	Schema string
	// Table is the name of the markers table. Defaults to "processed".
	Table string
	// Retention is how long a marker is kept before the sweeper deletes
	// it. It must be longer than the longest time after which the source
	// can deliver a message again, or a late redelivery is applied twice.
	// Negative values are rejected. Defaults to 7 days (DefaultRetention).
	Retention time.Duration
	// RedeliveryHorizon is the longest time after which the source can
	// deliver a message again (Kafka retention, SQS retention period, …).
	// When set and Retention is shorter, New logs a warning. Defaults to 0
	// (unknown: no check).
	RedeliveryHorizon time.Duration
	// SweepBatch is the most markers one sweep transaction deletes.
	// Defaults to 1000 (DefaultSweepBatch).
	SweepBatch int
	// SweepInterval is the pause between sweeps in RunSweeper.
	// Defaults to 1 minute (DefaultSweepInterval).
	SweepInterval time.Duration
	// ManualSweep stops consumers from running the sweeper: sweep with
	// RunSweeper, Sweep or `effectively sweep` instead. Defaults to false: a
	// consumer using this strategy runs RunSweeper in the background
	// (several consumers sweeping at once skip each other's rows).
	ManualSweep bool
	// MaxIDLen is the longest Key.Scope and Key.ID, in bytes, that Claim
	// accepts; at most MaxMaxIDLen. Defaults to dedupe.DefaultMaxIDLen.
	MaxIDLen int
	// Logger receives the retention warning and the sweeper's reports.
	// Defaults to warnings and errors on stderr.
	Logger *slog.Logger
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = pg.DefaultSchema
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.SweepBatch == 0 {
		c.SweepBatch = DefaultSweepBatch
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.MaxIDLen == 0 {
		c.MaxIDLen = dedupe.DefaultMaxIDLen
	}
	if c.Logger == nil {
		c.Logger = logx.Default()
	}
	return c
}

// validate checks a Config whose defaults are filled in.
func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return pg.ConfigErrorf("idset", field, format, args...)
	}
	for _, f := range [...]struct{ name, v string }{{"Schema", c.Schema}, {"Table", c.Table}} {
		if err := pg.ValidateIdentifier(f.v, 0); err != nil {
			return bad(f.name, "%v", err)
		}
	}
	switch {
	case c.Retention < 0:
		return bad("Retention", "must not be negative, got %v", c.Retention)
	case c.RedeliveryHorizon < 0:
		return bad("RedeliveryHorizon", "must not be negative, got %v", c.RedeliveryHorizon)
	case c.SweepBatch < 0:
		return bad("SweepBatch", "must not be negative, got %d", c.SweepBatch)
	case c.SweepInterval < 0:
		return bad("SweepInterval", "must not be negative, got %v", c.SweepInterval)
	case c.MaxIDLen < 0 || c.MaxIDLen > MaxMaxIDLen:
		return bad("MaxIDLen", "must be between 1 and %d (0 for the default), got %d", MaxMaxIDLen, c.MaxIDLen)
	}
	return nil
}
