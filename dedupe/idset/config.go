package idset

import (
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/internal/logx"
)

// DefaultTable is the name of the markers table unless configured otherwise.
const DefaultTable = "processed"

// DefaultRetention is how long markers are kept unless configured otherwise.
const DefaultRetention = 7 * 24 * time.Hour

// MaxMaxIDLen is the largest MaxIDLen accepted: with scope and ID both at
// most this long, a key still fits in a PostgreSQL B-tree index entry.
const MaxMaxIDLen = 1024

// maxIdentLen is PostgreSQL's identifier length limit (NAMEDATALEN - 1).
const maxIdentLen = 63

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
	// Negative values are rejected. Defaults to 7 days.
	Retention time.Duration
	// RedeliveryHorizon is the longest time after which the source can
	// deliver a message again (Kafka retention, SQS retention period, …).
	// When set and Retention is shorter, New logs a warning. Defaults to 0
	// (unknown: no check).
	RedeliveryHorizon time.Duration
	// SweepBatch is the most markers one sweep transaction deletes.
	// Defaults to 1000.
	SweepBatch int
	// SweepInterval is the pause between sweeps in RunSweeper.
	// Defaults to 1 minute.
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
		c.Schema = dedupe.DefaultSchema
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.SweepBatch == 0 {
		c.SweepBatch = 1000
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = time.Minute
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
		return fmt.Errorf("idset: %w", &dedupe.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	for _, f := range [...]struct{ name, v string }{{"Schema", c.Schema}, {"Table", c.Table}} {
		switch {
		case len(f.v) > maxIdentLen:
			return bad(f.name, "%q is %d bytes long, over PostgreSQL's limit of %d", f.v, len(f.v), maxIdentLen)
		case !utf8.ValidString(f.v):
			return bad(f.name, "%q is not valid UTF-8", f.v)
		case strings.IndexByte(f.v, 0) >= 0:
			return bad(f.name, "%q contains a NUL byte", f.v)
		}
	}
	if c.Retention < 0 {
		return bad("Retention", "must be positive, got %v", c.Retention)
	}
	if c.RedeliveryHorizon < 0 {
		return bad("RedeliveryHorizon", "must not be negative, got %v", c.RedeliveryHorizon)
	}
	if c.SweepBatch < 0 {
		return bad("SweepBatch", "must be positive, got %d", c.SweepBatch)
	}
	if c.SweepInterval < 0 {
		return bad("SweepInterval", "must be positive, got %v", c.SweepInterval)
	}
	if c.MaxIDLen < 0 || c.MaxIDLen > MaxMaxIDLen {
		return bad("MaxIDLen", "must be between 1 and %d, got %d", MaxMaxIDLen, c.MaxIDLen)
	}
	return nil
}
