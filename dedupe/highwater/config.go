package highwater

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/internal/logx"
	"github.com/effectively-once/effectively/pg"
)

// Mode says which sequence numbers of a sender are accepted after its mark.
type Mode uint8

const (
	// Strict applies a sender's messages exactly once and in order: seq ==
	// mark+1 is new, seq <= mark is a duplicate, and seq > mark+1 is a gap
	// (held back until the missing messages arrive). For producers that
	// number their messages 1, 2, 3, … without holes.
	Strict Mode = iota
	// Monotonic accepts any seq above the mark and moves the mark to it;
	// seq <= mark is a duplicate. For sequences with holes, such as Kafka
	// offsets or SQS FIFO sequence numbers. It never reports a gap.
	Monotonic
)

// String returns the mode's lower-case name.
func (m Mode) String() string {
	switch m {
	case Strict:
		return "strict"
	case Monotonic:
		return "monotonic"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Config configures a Strategy. The zero value is a usable strict-mode
// configuration.
type Config struct {
	// Mode is Strict or Monotonic. Defaults to Strict.
	Mode Mode
	// Schema holds the tables. Defaults to "effectively" (pg.DefaultSchema).
	Schema string
	// Table is the marks table, one row per (scope, sender). Defaults to
	// "marks" (DefaultTable).
	Table string
	// AdvancesTable is the audit table of marks moved by Advance. Its index
	// is named AdvancesTable + "_sender_idx", so it may be at most 52 bytes.
	// Defaults to Table + "_advances" (DefaultAdvancesSuffix).
	AdvancesTable string
	// CacheSize bounds the in-memory LRU cache of marks, in senders; an
	// entry takes about 150 bytes with a 20-byte scope and sender and a
	// fingerprint (some 15 MB for 100,000). A negative value turns the cache
	// off. Defaults to 100,000 (DefaultCacheSize).
	CacheSize int
	// ReorderWindow is how far ahead of a sender's mark a sequence number may
	// be and still count as ordinary reordering, in strict mode. A message up
	// to ReorderWindow past the next expected seq is a gap, held back quietly
	// until the missing messages arrive. One further ahead is a gap too (it
	// is still held, never dropped), but it is logged as suspicious and
	// counted in Stats.FarGaps: the producer may have skipped or reset its
	// numbering. Defaults to 1,000 (DefaultReorderWindow).
	ReorderWindow int64
	// StuckAfter is how long a sender may wait behind a missing seq before
	// it is logged as stuck, with a warning repeated every StuckAfter while
	// it stays stuck (checked as claims run). Defaults to 1m
	// (DefaultStuckAfter).
	StuckAfter time.Duration
	// MaxKeyLen is the longest scope and sender, in bytes. Defaults to
	// dedupe.DefaultMaxIDLen (512).
	MaxKeyLen int
	// Logger receives warnings about far gaps and stuck senders. Defaults to
	// warnings and errors on stderr.
	Logger *slog.Logger
}

// Defaults of the Config fields.
const (
	DefaultTable          = "marks"
	DefaultAdvancesSuffix = "_advances" // appended to Table
	DefaultCacheSize      = 100_000
	DefaultReorderWindow  = 1000
	DefaultStuckAfter     = time.Minute
)

// advancesIndexSuffix names the advances table's index after it.
const advancesIndexSuffix = "_sender_idx"

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = pg.DefaultSchema
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.AdvancesTable == "" {
		c.AdvancesTable = c.Table + DefaultAdvancesSuffix
	}
	if c.CacheSize == 0 {
		c.CacheSize = DefaultCacheSize
	}
	if c.ReorderWindow == 0 {
		c.ReorderWindow = DefaultReorderWindow
	}
	if c.StuckAfter == 0 {
		c.StuckAfter = DefaultStuckAfter
	}
	if c.MaxKeyLen == 0 {
		c.MaxKeyLen = dedupe.DefaultMaxIDLen
	}
	if c.Logger == nil {
		c.Logger = logx.Default()
	}
	return c
}

func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return pg.ConfigErrorf("highwater", field, format, args...)
	}
	for _, f := range [...]struct {
		name, v string
		reserve int
	}{{"Schema", c.Schema, 0}, {"Table", c.Table, 0}, {"AdvancesTable", c.AdvancesTable, len(advancesIndexSuffix)}} {
		if err := pg.ValidateIdentifier(f.v, f.reserve); err != nil {
			return bad(f.name, "%v", err)
		}
	}
	switch {
	case c.Mode > Monotonic:
		return bad("Mode", "unknown mode %d (use highwater.Strict or highwater.Monotonic)", c.Mode)
	case c.ReorderWindow < 0:
		return bad("ReorderWindow", "must not be negative, got %d", c.ReorderWindow)
	case c.StuckAfter < 0:
		return bad("StuckAfter", "must not be negative, got %s", c.StuckAfter)
	case c.MaxKeyLen < 0:
		return bad("MaxKeyLen", "must not be negative, got %d", c.MaxKeyLen)
	case c.Table == c.AdvancesTable:
		return bad("AdvancesTable", "must differ from Table %q", c.Table)
	}
	return nil
}
