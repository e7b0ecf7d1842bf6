package bloom

import (
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// ErrIsolation is returned by Claim in a transaction that is not READ
// COMMITTED: the existence probe must see what the transactions it waited
// for committed, which a REPEATABLE READ or SERIALIZABLE snapshot taken
// earlier does not.
var ErrIsolation = errors.New("bloom: Claim needs a READ COMMITTED transaction")

// ErrNoPartition is returned by Claim when the partition for the current
// slice does not exist: Maintain (or RunMaintenance) has not run recently
// enough.
var ErrNoPartition = errors.New("bloom: no partition for the current slice (run Maintain or RunMaintenance)")

// Strategy is the Bloom-prefiltered, time-partitioned marker strategy. It
// implements dedupe.Strategy, dedupe.Committer, dedupe.Retainer and
// dedupe.Migrator. It is safe for concurrent use.
type Strategy struct {
	cfg      Config
	parent   string // quoted schema.table
	gateKey  int64  // advisory lock separating claims from seals
	maintKey int64  // advisory lock serialising partition creation between processes
	dropKey  int64  // advisory lock: one process drops expired partitions at a time
	k        uint   // hash functions per filter, shared by every filter

	barrierSeq   string // quoted schema.table_barrier: the clock of the latest barrier
	exclusiveGUC string // transaction-local setting: this transaction holds the gate exclusively
	claimSQL     string // with targetPartition for the target slice's partition
	claimMu      sync.Mutex
	claimSlice   int64  // the slice of claimText
	claimText    string // claimSQL for claimSlice
	readHeldSQL  string
	barrierSQL   string
	clockOffset  atomic.Int64 // database clock minus local clock, in ns, as last seen
	barrierAt    atomic.Int64 // the latest barrier's clock this process saw, in µs since 1970

	filters filterSet
	sealMu  sync.Mutex // one seal or warm-up at a time

	written written // which slice each claim's new keys went to, until Committed
	warm    atomic.Bool
	stats   counters
}

var (
	_ dedupe.Strategy   = (*Strategy)(nil)
	_ dedupe.Committer  = (*Strategy)(nil)
	_ dedupe.Retainer   = (*Strategy)(nil)
	_ dedupe.Migrator   = (*Strategy)(nil)
	_ dedupe.Maintainer = (*Strategy)(nil)
	_ dedupe.Warmer     = (*Strategy)(nil)
)

// New returns a Strategy for cfg, or an error wrapping
// pg.ErrInvalidConfig when a value is out of range. It does not touch
// the database: apply Migrations with pg.Migrate, then run Maintain (or
// RunMaintenance) so that partitions exist, and Warm to load the filters.
func New(cfg Config) (*Strategy, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Strategy{
		cfg:    cfg,
		parent: pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize(),
		k:      uint(math.Ceil(-math.Log2(cfg.FalsePositiveRate))),
	}
	name := cfg.Schema + "." + cfg.Table
	s.gateKey = hash64("effectively.bloom.gate\x00" + name)
	s.maintKey = hash64("effectively.bloom.maintain\x00" + name)
	s.dropKey = hash64("effectively.bloom.drop\x00" + name)
	s.filters.slices = map[int64]*sliceFilter{}
	s.written.slice = map[scopeID]int64{}
	s.exclusiveGUC = fmt.Sprintf("effectively.bloom_gate_%x", uint64(s.gateKey))
	s.barrierSeq = pgx.Identifier{cfg.Schema, cfg.Table + barrierSuffix}.Sanitize()
	s.buildSQL()
	return s, nil
}

// Name returns "bloom".
func (s *Strategy) Name() string { return "bloom" }

// Retention returns how long a marker is kept at least.
func (s *Strategy) Retention() time.Duration { return s.cfg.Retention }

// Warmed reports whether every closed live slice has a filter built from the
// store, so that new keys skip their probes. Before that, Claim probes the
// partitions whose filters are missing for every key.
func (s *Strategy) Warmed() bool { return s.warm.Load() }

// Migrations returns the migration line that creates the partitioned
// markers table. Partitions are created by Maintain.
func (s *Strategy) Migrations() []pg.Line {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the embedded directory always exists
	}
	return []pg.Line{{
		Name: "bloom:" + s.cfg.Table,
		FS:   sub,
		Idents: map[string]string{
			"schema":  s.cfg.Schema,
			"table":   s.cfg.Table,
			"barrier": s.cfg.Table + barrierSuffix,
		},
	}}
}

func hash64(s string) int64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return int64(h.Sum64())
}

// sliceOf returns the start of the slice that holds t.
func (s *Strategy) sliceOf(t time.Time) time.Time {
	return t.Truncate(s.cfg.Slice).UTC()
}

// liveFrom returns the start of the oldest slice still live at now: the
// slices whose end is after now - Retention.
func (s *Strategy) liveFrom(now time.Time) time.Time {
	return s.sliceOf(now.Add(-s.cfg.Retention))
}
