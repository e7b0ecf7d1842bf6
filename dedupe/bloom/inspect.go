package bloom

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
)

var _ dedupe.Inspector = (*Strategy)(nil)

// MarkerStats reports the markers table's size (all partitions) and, per
// scope, its markers and the oldest and newest slices they were written
// in (dedupe.Inspector).
func (s *Strategy) MarkerStats(ctx context.Context, db pg.DB, scope string) (dedupe.MarkerStats, error) {
	st := dedupe.MarkerStats{
		Strategy: s.Name(), Table: s.cfg.Schema + "." + s.cfg.Table,
		Details: map[string]string{"retention": s.cfg.Retention.String(), "slice": s.cfg.Slice.String()},
	}
	parts, err := s.partitions(ctx, db)
	if err != nil {
		return st, fmt.Errorf("bloom: stats: %w", err)
	}
	st.Details["partitions"] = strconv.Itoa(len(parts))
	tx, err := db.Begin(ctx)
	if err != nil {
		return st, fmt.Errorf("bloom: stats: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	size, err := dedupe.SizeOf(ctx, tx, s.parent)
	if err != nil {
		return st, fmt.Errorf("bloom: stats: %w", err)
	}
	st.Tables = []dedupe.TableSize{size}
	if size.Exists {
		if st.Scopes, err = dedupe.ScopeStats(ctx, tx, s.parent, "slice", scope); err != nil {
			return st, fmt.Errorf("bloom: stats: %w", err)
		}
	}
	return st, nil
}

// SweepExpired runs Maintain, which drops the partitions whose whole slice
// is older than the retention (and creates the current ones), or with
// dryRun counts the partitions it would drop (dedupe.Inspector).
func (s *Strategy) SweepExpired(ctx context.Context, db pg.DB, dryRun bool) (dedupe.SweepReport, error) {
	rep := dedupe.SweepReport{Table: s.cfg.Schema + "." + s.cfg.Table, Retention: s.cfg.Retention, Unit: "partition"}
	before, err := s.partitions(ctx, db)
	if err != nil {
		return rep, fmt.Errorf("bloom: sweep: listing partitions: %w", err)
	}
	if dryRun {
		now, err := s.dbNow(ctx, db)
		if err != nil {
			return rep, err
		}
		horizon := now.Add(-s.cfg.Retention)
		for _, p := range before {
			if !p.start.Add(s.cfg.Slice).After(horizon) {
				rep.Removed++
			}
		}
		rep.Summary = fmt.Sprintf("Drop the partitions of %s older than %s (%d of %d)", rep.Table, rep.Retention, rep.Removed, len(before))
		return rep, nil
	}
	dropped := s.stats.dropped.Load()
	if err := s.Maintain(ctx, db); err != nil {
		return rep, err
	}
	rep.Removed = s.stats.dropped.Load() - dropped
	after, err := s.partitions(ctx, db)
	if err != nil {
		return rep, fmt.Errorf("bloom: sweep: listing partitions: %w", err)
	}
	rep.Summary = fmt.Sprintf("maintenance of %s done: %d partition(s) before, %d after", rep.Table, len(before), len(after))
	return rep, nil
}

// dbNow is the database's clock, which maintenance goes by.
func (s *Strategy) dbNow(ctx context.Context, db pg.DB) (time.Time, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("bloom: sweep: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var now time.Time
	if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("bloom: sweep: %w", err)
	}
	return now, nil
}
