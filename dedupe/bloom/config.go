package bloom

import (
	"log/slog"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/internal/logx"
	"github.com/effectively-once/effectively/pg"
)

// DefaultTable is the name of the partitioned markers table unless
// configured otherwise.
const DefaultTable = "bloom_markers"

// Defaults of the Config fields.
const (
	DefaultSlice                = time.Hour
	DefaultRetention            = 7 * 24 * time.Hour
	DefaultExpectedKeysPerSlice = 1_000_000
	DefaultFalsePositiveRate    = 0.005
	DefaultPartitionsAhead      = 2
	DefaultSealTimeout          = 2 * time.Second
)

// MaxMaxIDLen is the largest MaxIDLen accepted, so that a key still fits in
// a PostgreSQL B-tree index entry.
const MaxMaxIDLen = 1024

// partitionSuffixLen is the length of "_20060102t150405", appended to Table
// to name a partition.
const partitionSuffixLen = len("_") + len(partitionTimeLayout)

// barrierSuffix names the sequence that holds the latest barrier's clock:
// Table + barrierSuffix (shorter than a partition's suffix).
const barrierSuffix = "_barrier"

// Config configures a Strategy. The zero value is usable.
type Config struct {
	// Schema is the schema that holds the markers table; the migrations
	// create it when missing. Defaults to "effectively".
	Schema string
	// Table is the name of the partitioned markers table. Partitions are
	// named Table + "_" + the slice start in UTC (e.g.
	// bloom_markers_20260102t150000), so Table may be at most 47 bytes.
	// Defaults to "bloom_markers".
	Table string
	// Slice is the time span of one partition, and of one filter. It must
	// be a whole number of seconds, at least one second. Changing it for an
	// existing table is not supported (new partitions would overlap old
	// ones). Defaults to 1 hour.
	Slice time.Duration
	// Retention is how long a marker is kept at least: a partition is
	// dropped once its whole slice is older than Retention. It must be
	// longer than Slice and longer than the longest time after which the
	// source can deliver a message again. Defaults to 7 days.
	Retention time.Duration
	// ExpectedKeysPerSlice sizes the filter of the current slice, per scope.
	// The filter of a closed (sealed) slice is rebuilt from the store and
	// sized from the number of markers it actually holds. Defaults to
	// 1,000,000.
	ExpectedKeysPerSlice int
	// FalsePositiveRate is the target false-positive rate of each filter,
	// between 0 and 0.5 exclusive. A key is tested against the filter of
	// every live slice, so a new key needs about (Retention/Slice) ×
	// FalsePositiveRate probes, each an index lookup in a partition that
	// is rarely cached. A filter costs -ln(p)/ln(2)² bits per key: 1.38
	// bytes at the default 0.005 (1.20 at 0.01, 1.80 at 0.001), for every
	// live marker, in every process. Defaults to 0.005.
	FalsePositiveRate float64
	// PartitionsAhead is how many partitions after the current one Maintain
	// keeps created, at least 1. Defaults to 2.
	PartitionsAhead int
	// SealTimeout bounds how long Maintain and Warm wait for the claiming
	// transactions in flight to finish before they trust a closed slice's
	// filter (see the package documentation); a slice that cannot be
	// sealed in time is probed until a later try succeeds. Claims that
	// start while a seal waits wait behind it. Defaults to 2 seconds.
	SealTimeout time.Duration
	// DisableFilter turns the filters off: every key is probed in every
	// live partition. For comparison and troubleshooting. Defaults to false.
	DisableFilter bool
	// MaxIDLen is the longest Key.Scope and Key.ID, in bytes, that Claim
	// accepts; at most MaxMaxIDLen. Defaults to dedupe.DefaultMaxIDLen.
	MaxIDLen int
	// Logger receives maintenance and warm-up reports. Defaults to a logger
	// that discards everything: the consumer logs the errors that stop
	// maintenance or warm-up.
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
	if c.Slice == 0 {
		c.Slice = DefaultSlice
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.ExpectedKeysPerSlice == 0 {
		c.ExpectedKeysPerSlice = DefaultExpectedKeysPerSlice
	}
	if c.FalsePositiveRate == 0 {
		c.FalsePositiveRate = DefaultFalsePositiveRate
	}
	if c.PartitionsAhead == 0 {
		c.PartitionsAhead = DefaultPartitionsAhead
	}
	if c.SealTimeout == 0 {
		c.SealTimeout = DefaultSealTimeout
	}
	if c.MaxIDLen == 0 {
		c.MaxIDLen = dedupe.DefaultMaxIDLen
	}
	if c.Logger == nil {
		c.Logger = logx.Discard()
	}
	return c
}

// validate checks a Config whose defaults are filled in.
func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return pg.ConfigErrorf("bloom", field, format, args...)
	}
	if err := pg.ValidateIdentifier(c.Schema, 0); err != nil {
		return bad("Schema", "%v", err)
	}
	if err := pg.ValidateIdentifier(c.Table, partitionSuffixLen); err != nil {
		return bad("Table", "%v", err)
	}
	switch {
	case c.Slice < time.Second:
		return bad("Slice", "must be at least 1s, got %v", c.Slice)
	case c.Slice%time.Second != 0:
		return bad("Slice", "must be a whole number of seconds, got %v", c.Slice)
	case c.Retention <= c.Slice:
		return bad("Retention", "must be longer than Slice (%v), got %v", c.Slice, c.Retention)
	case c.ExpectedKeysPerSlice < 0:
		return bad("ExpectedKeysPerSlice", "must not be negative, got %d", c.ExpectedKeysPerSlice)
	case !(c.FalsePositiveRate > 0 && c.FalsePositiveRate < 0.5):
		return bad("FalsePositiveRate", "must be between 0 and 0.5 exclusive, got %v", c.FalsePositiveRate)
	case c.PartitionsAhead < 0:
		return bad("PartitionsAhead", "must not be negative, got %d", c.PartitionsAhead)
	case c.SealTimeout < 0:
		return bad("SealTimeout", "must not be negative, got %v", c.SealTimeout)
	case c.MaxIDLen < 0 || c.MaxIDLen > MaxMaxIDLen:
		return bad("MaxIDLen", "must be between 1 and %d (0 for the default), got %d", MaxMaxIDLen, c.MaxIDLen)
	}
	return nil
}
