package idset

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
)

var _ dedupe.Inspector = (*Strategy)(nil)

func (s *Strategy) table() string { return pgx.Identifier{s.cfg.Schema, s.cfg.Table}.Sanitize() }

// MarkerStats reports the markers table's size and, per scope, its markers
// and when the oldest and newest were written (dedupe.Inspector).
func (s *Strategy) MarkerStats(ctx context.Context, db pg.DB, scope string) (dedupe.MarkerStats, error) {
	st := dedupe.MarkerStats{
		Strategy: s.Name(), Table: s.cfg.Schema + "." + s.cfg.Table,
		Details: map[string]string{"retention": s.cfg.Retention.String()},
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return st, fmt.Errorf("idset: stats: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	size, err := dedupe.SizeOf(ctx, tx, s.table())
	if err != nil {
		return st, fmt.Errorf("idset: stats: %w", err)
	}
	st.Tables = []dedupe.TableSize{size}
	if size.Exists {
		if st.Scopes, err = dedupe.ScopeStats(ctx, tx, s.table(), "processed_at", scope); err != nil {
			return st, fmt.Errorf("idset: stats: %w", err)
		}
	}
	return st, nil
}

// SweepExpired deletes the markers older than the retention with Sweep,
// or with dryRun counts them (dedupe.Inspector).
func (s *Strategy) SweepExpired(ctx context.Context, db pg.DB, dryRun bool) (dedupe.SweepReport, error) {
	rep := dedupe.SweepReport{Table: s.cfg.Schema + "." + s.cfg.Table, Retention: s.cfg.Retention, Unit: "marker"}
	if !dryRun {
		n, err := s.Sweep(ctx, db)
		rep.Removed = n
		rep.Summary = fmt.Sprintf("deleted %d expired marker(s) from %s", n, rep.Table)
		return rep, err
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return rep, fmt.Errorf("idset: sweep: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+s.table()+` WHERE processed_at < now() - $1::bigint * interval '1 microsecond'`,
		s.cfg.Retention.Microseconds()).Scan(&rep.Removed); err != nil {
		return rep, fmt.Errorf("idset: sweep: %w", err)
	}
	if rep.Removed == 0 {
		rep.Nothing = true
		rep.Summary = fmt.Sprintf("no marker in %s is older than %s", rep.Table, rep.Retention)
	} else {
		rep.Summary = fmt.Sprintf("Delete about %d marker(s) older than %s from %s", rep.Removed, rep.Retention, rep.Table)
	}
	return rep, nil
}
