package highwater

import (
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"sync/atomic"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Strategy keeps one mark per (scope, sender): the highest sequence number
// applied. It implements dedupe.Strategy, dedupe.Committer and
// dedupe.Migrator. It is safe for concurrent use.
type Strategy struct {
	cfg      Config
	marks    string // quoted schema.table
	advances string
	cache    *markCache
	stuck    stuckSet

	gaps, farGaps atomic.Uint64

	// statements, precomputed for the configured tables
	insertSQL, lockSQL, updateSQL string
}

var (
	_ dedupe.Strategy   = (*Strategy)(nil)
	_ dedupe.Committer  = (*Strategy)(nil)
	_ dedupe.Migrator   = (*Strategy)(nil)
	_ dedupe.KeyChecker = (*Strategy)(nil)
	_ dedupe.Sequencer  = (*Strategy)(nil)
)

// New returns a Strategy for cfg, or a *pg.ConfigError (matching
// pg.ErrInvalidConfig) for a bad value. Its tables are created by the
// migrations that Migrations returns.
func New(cfg Config) (*Strategy, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Strategy{
		cfg:      cfg,
		marks:    pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize(),
		advances: pgx.Identifier{cfg.Schema, cfg.AdvancesTable}.Sanitize(),
	}
	if cfg.CacheSize > 0 {
		s.cache = newMarkCache(cfg.CacheSize)
	}
	s.insertSQL = `INSERT INTO ` + s.marks + ` AS m (scope, sender, seq, fingerprint)
SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::bytea[])
ON CONFLICT (scope, sender) DO NOTHING
RETURNING m.scope, m.sender`
	s.lockSQL = `SELECT m.scope, m.sender, m.seq, m.fingerprint
FROM ` + s.marks + ` AS m
JOIN unnest($1::text[], $2::text[]) AS i(scope, sender) ON m.scope = i.scope AND m.sender = i.sender
ORDER BY m.scope, m.sender
FOR UPDATE OF m`
	s.updateSQL = `UPDATE ` + s.marks + ` AS m
SET seq = u.seq, fingerprint = u.fp, updated_at = now()
FROM unnest($1::text[], $2::text[], $3::int8[], $4::bytea[], $5::int8[]) AS u(scope, sender, seq, fp, old)
WHERE m.scope = u.scope AND m.sender = u.sender AND m.seq = u.old AND u.seq > u.old`
	return s, nil
}

// Sequenced reports whether the consumer must hold a sender's later
// messages back while an earlier one awaits redelivery (dedupe.Sequencer):
// in monotonic mode it must, since a later seq moves the mark past the
// earlier one, whose redelivery would then be a duplicate. Strict mode
// keeps order itself: a later seq is a gap until the earlier one applied.
func (s *Strategy) Sequenced() bool { return s.cfg.Mode == Monotonic }

// Name returns "highwater".
func (s *Strategy) Name() string { return "highwater" }

// Mode returns the configured mode.
func (s *Strategy) Mode() Mode { return s.cfg.Mode }

// Migrations returns the line that creates the marks table and the audit
// table of Advance, named "highwater:" + the marks table. The tables live
// in Config.Schema whatever schema Migrate is given.
func (s *Strategy) Migrations() []pg.Line {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(fmt.Sprintf("highwater: embedded migrations: %v", err)) // cannot happen: the directory is embedded
	}
	return []pg.Line{{
		Name: "highwater:" + s.cfg.Table,
		FS:   sub,
		Idents: map[string]string{
			"schema":              s.cfg.Schema,
			"marks":               s.cfg.Table,
			"advances":            s.cfg.AdvancesTable,
			"advances_sender_idx": s.cfg.AdvancesTable + advancesIndexSuffix,
		},
	}}
}

// CheckKey reports, as a *dedupe.KeyError, a key this strategy cannot
// claim: one that dedupe.Validate rejects, or that has no Sender, or a Seq
// below 1. Claim rejects a batch holding such a key before it runs any
// statement; callers may check keys first to park the bad ones alone.
func (s *Strategy) CheckKey(k dedupe.Key) error {
	if err := dedupe.Validate(k, s.cfg.MaxKeyLen); err != nil {
		return err
	}
	if k.Sender == "" {
		return &dedupe.KeyError{Key: k, Reason: "highwater needs a sender: the key has no Sender"}
	}
	if k.Seq < 1 {
		return &dedupe.KeyError{Key: k, Reason: fmt.Sprintf("highwater needs a sequence number of at least 1, got %d", k.Seq)}
	}
	return nil
}

// Committed records the outcome of a committed claim in the cache: a new
// key moves its sender's cached mark up to its seq (with its fingerprint),
// and a duplicate or mismatch proves the mark is at least its seq. Gaps
// teach nothing. It must only be given verdicts that committed; a cached
// mark is then never above the true mark.
func (s *Strategy) Committed(keys []dedupe.Key, verdicts []dedupe.Verdict) {
	n := min(len(keys), len(verdicts))
	var ups []update
	if s.cache != nil {
		ups = make([]update, 0, n)
	}
	tracking := s.stuck.len() > 0
	for i := range n {
		k, v := keys[i], verdicts[i]
		if k.Sender == "" || k.Seq < 1 {
			continue
		}
		switch v {
		case dedupe.VerdictNew:
			if s.cache != nil {
				ups = append(ups, update{key: senderKey(k), seq: k.Seq, fp: k.Fingerprint, fpKnown: true})
			}
			if tracking {
				s.stuck.progressed(senderKey(k), k.Seq)
			}
		case dedupe.VerdictDuplicate, dedupe.VerdictMismatch:
			if s.cache != nil {
				ups = append(ups, update{key: senderKey(k), seq: k.Seq})
			}
		}
	}
	s.cache.raise(ups)
}

// Stats are counters for metrics. Counts are since New.
type Stats struct {
	// CacheHits counts keys answered by the cache with no database round trip.
	CacheHits uint64
	// CacheMisses counts keys that needed the database.
	CacheMisses uint64
	// CacheEvictions counts senders dropped from the full cache.
	CacheEvictions uint64
	// CacheEntries is the number of senders cached now.
	CacheEntries int
	// Gaps counts keys that got VerdictGap.
	Gaps uint64
	// FarGaps counts the gaps further than Config.ReorderWindow ahead.
	FarGaps uint64
	// StuckSenders is the number of senders held back behind a missing
	// sequence number now (see Stuck).
	StuckSenders int
}

// Stats returns the strategy's counters.
func (s *Strategy) Stats() Stats {
	st := Stats{Gaps: s.gaps.Load(), FarGaps: s.farGaps.Load(), StuckSenders: s.stuck.len()}
	st.CacheHits, st.CacheMisses, st.CacheEvictions, st.CacheEntries = s.cache.stats()
	return st
}

// Stuck returns the senders whose messages are held back behind a missing
// sequence number, longest stuck first. A sender leaves the list when its
// mark reaches the hole's end (the missing messages arrived, or Advance
// moved it).
func (s *Strategy) Stuck() []StuckSender { return s.stuck.list() }

// ResetCache empties the marks cache. Call it after changing the marks
// table by other means than Claim and Advance (restoring a backup, deleting
// rows), so that no cached mark is above the true one.
func (s *Strategy) ResetCache() { s.cache.reset() }

func senderKey(k dedupe.Key) string { return k.Scope + "\x00" + k.Sender }

func (s *Strategy) logger() *slog.Logger { return s.cfg.Logger }
