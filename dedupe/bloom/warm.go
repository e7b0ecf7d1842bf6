package bloom

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5/pgconn"
)

// progressEvery is how many keys a warm-up loads between progress reports.
const progressEvery = 1_000_000

// errSealBusy reports a barrier that timed out behind long transactions.
var errSealBusy = errors.New("bloom: claiming transactions stayed in flight longer than SealTimeout")

// barrier waits until no claiming transaction is in flight, by taking the
// gate lock that every claim holds shared, records the database clock read
// while holding it as the latest barrier, and returns it. Every claim that commits a marker after the
// barrier read the clock later, so it wrote to a slice that starts after
// the returned time's slice begins; every slice that ended at or before the
// returned time is complete.
func (s *Strategy) barrier(ctx context.Context, db pg.DB) (time.Time, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return time.Time{}, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`,
		fmt.Sprintf("%dms", max(s.cfg.SealTimeout.Milliseconds(), 1))); err != nil {
		return time.Time{}, err
	}
	var now time.Time
	err = tx.QueryRow(ctx, `SELECT clock_timestamp() FROM (SELECT pg_advisory_xact_lock($1)) AS g`, s.gateKey).Scan(&now)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "55P03" {
		return time.Time{}, errSealBusy
	}
	if err != nil {
		return time.Time{}, err
	}
	// Publish the barrier, still holding the gate: claims that start after
	// it write to now's slice or a later one, without per-key locks.
	if _, err := tx.Exec(ctx, s.barrierSQL, now.UnixMicro()); err != nil {
		return time.Time{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return time.Time{}, err
	}
	s.noteBarrier(now.UnixMicro())
	return now, nil
}

// seal builds, from the store, the filter of every live slice that has
// closed and is not sealed yet. With open, it also loads the current
// slice's markers into this process's open filter (a hint).
func (s *Strategy) seal(ctx context.Context, db pg.DB, open bool) error {
	s.sealMu.Lock()
	defer s.sealMu.Unlock()
	var todo []time.Time
	need := func(now time.Time) {
		todo = todo[:0]
		for t := s.liveFrom(now); t.Before(s.sliceOf(now)); t = t.Add(s.cfg.Slice) {
			if !s.filters.sealed(t) {
				todo = append(todo, t)
			}
		}
	}
	need(time.Now()) // a cheap first look, before waiting for the barrier
	if len(todo) == 0 && !open && s.warm.Load() {
		return nil
	}
	now, err := s.barrier(ctx, db)
	if err != nil {
		return fmt.Errorf("bloom: sealing: %w", err)
	}
	need(now)
	begin := time.Now()
	var cur *time.Time
	if open {
		c := s.sliceOf(now)
		cur = &c
	}
	loaded, total, err := s.load(ctx, db, todo, cur)
	if err != nil {
		return fmt.Errorf("bloom: sealing: %w", err)
	}
	for _, sf := range loaded {
		if !sf.sealed {
			s.mergeOpen(sf)
			continue
		}
		s.filters.install(sf)
		s.stats.sealed.Add(1)
	}
	s.warm.Store(true)
	if len(todo) > 0 || open {
		s.cfg.Logger.Info("bloom: filters built from the store", "table", s.cfg.Table,
			"sealed_slices", len(todo), "keys", total, "took", time.Since(begin))
	}
	return nil
}

// load streams the markers of the closed slices sealed and, when open is
// set, of the open slice it names into new sliceFilters, one a slice, in
// one transaction of two statements however many slices there are. A
// sealed slice's filters are sized from the number of markers of each
// scope; an open slice's from ExpectedKeysPerSlice, since it keeps
// growing.
func (s *Strategy) load(ctx context.Context, db pg.DB, sealed []time.Time, open *time.Time) ([]*sliceFilter, int64, error) {
	bySlice := make(map[int64]*sliceFilter, len(sealed)+1)
	all := slices.Clone(sealed)
	for _, t := range sealed {
		bySlice[t.Unix()] = &sliceFilter{start: t, sealed: true, byScope: map[string]*bloom.BloomFilter{}}
	}
	if open != nil {
		bySlice[open.Unix()] = &sliceFilter{start: *open, byScope: map[string]*bloom.BloomFilter{}}
		all = append(all, *open)
	}
	if len(all) == 0 {
		return nil, 0, nil
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if len(sealed) > 0 {
		rows, err := tx.Query(ctx, `SELECT slice, scope, count(*) FROM `+s.parent+`
WHERE slice = ANY ($1::timestamptz[]) GROUP BY slice, scope`, sealed)
		if err != nil {
			return nil, 0, err
		}
		for rows.Next() {
			var t time.Time
			var scope string
			var n int64
			if err := rows.Scan(&t, &scope, &n); err != nil {
				rows.Close()
				return nil, 0, err
			}
			if sf := bySlice[t.Unix()]; sf != nil {
				sf.byScope[scope] = newFilter(int(n), s.cfg.FalsePositiveRate, s.k)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, 0, err
		}
	}
	rows, err := tx.Query(ctx, `SELECT slice, scope, id FROM `+s.parent+` WHERE slice = ANY ($1::timestamptz[])`, all)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var n int64
	var t time.Time
	for rows.Next() {
		raw := rows.RawValues() // text in binary format is the raw UTF-8
		if err := rows.Scan(&t, nil, nil); err != nil {
			return nil, 0, err
		}
		sf := bySlice[t.Unix()]
		if sf == nil {
			continue
		}
		f := sf.byScope[string(raw[1])]
		if f == nil {
			// An open slice, or a marker written after the count: only
			// possible for a slice that was not closed.
			f = newFilter(s.cfg.ExpectedKeysPerSlice, s.cfg.FalsePositiveRate, s.k)
			sf.byScope[string(raw[1])] = f
		}
		f.Add(raw[2])
		sf.keys++
		n++
		if n%progressEvery == 0 {
			s.cfg.Logger.Info("bloom: warming filters", "table", s.cfg.Table, "slice", t, "keys", n)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	out := make([]*sliceFilter, 0, len(all))
	for _, t := range all {
		out = append(out, bySlice[t.Unix()])
	}
	return out, n, nil
}

// mergeOpen folds a freshly loaded open filter into this process's.
func (s *Strategy) mergeOpen(sf *sliceFilter) {
	s.filters.mu.Lock()
	defer s.filters.mu.Unlock()
	cur := s.filters.slices[sf.start.Unix()]
	if cur == nil {
		s.filters.slices[sf.start.Unix()] = sf
		return
	}
	if cur.sealed {
		return
	}
	for scope, f := range sf.byScope {
		if g := cur.byScope[scope]; g != nil && g.Merge(f) == nil {
			continue
		}
		cur.byScope[scope] = f
	}
}

// Warm rebuilds the filters from the live partitions, streaming their keys
// and logging progress every million keys: every closed slice gets a sealed
// filter, and the current slice's markers go into this process's open
// filter. Run it at start (after Maintain) and whenever the process may
// have missed markers. Until it returns, Claim stays correct by probing
// the partitions of every slice without a sealed filter, for every key.
// Warm waits up to SealTimeout for the claiming transactions in flight and
// returns an error if they do not finish by then.
func (s *Strategy) Warm(ctx context.Context, db pg.DB) error {
	if s.cfg.DisableFilter {
		return nil
	}
	return s.seal(ctx, db, true)
}
