package highwater

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
)

var _ dedupe.Inspector = (*Strategy)(nil)

// MarkerStats reports the sizes of the marks and advances tables and, per
// scope, its senders (one mark each) and when the least and the most
// recently updated marks were written (dedupe.Inspector).
func (s *Strategy) MarkerStats(ctx context.Context, db pg.DB, scope string) (dedupe.MarkerStats, error) {
	st := dedupe.MarkerStats{
		Strategy: s.Name(), Table: s.cfg.Schema + "." + s.cfg.Table,
		Details: map[string]string{"mode": s.cfg.Mode.String()},
	}
	marks := pgx.Identifier{s.cfg.Schema, s.cfg.Table}.Sanitize()
	tx, err := db.Begin(ctx)
	if err != nil {
		return st, fmt.Errorf("highwater: stats: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, t := range []string{marks, pgx.Identifier{s.cfg.Schema, s.cfg.AdvancesTable}.Sanitize()} {
		size, err := dedupe.SizeOf(ctx, tx, t)
		if err != nil {
			return st, fmt.Errorf("highwater: stats: %w", err)
		}
		st.Tables = append(st.Tables, size)
	}
	if st.Tables[0].Exists {
		if st.Scopes, err = dedupe.ScopeStats(ctx, tx, marks, "updated_at", scope); err != nil {
			return st, fmt.Errorf("highwater: stats: %w", err)
		}
	}
	return st, nil
}

// SweepExpired returns an error wrapping dedupe.ErrNoSweep: a mark holds
// its sender's last sequence number for good (dedupe.Inspector).
func (s *Strategy) SweepExpired(context.Context, pg.DB, bool) (dedupe.SweepReport, error) {
	return dedupe.SweepReport{}, fmt.Errorf("highwater marks do not expire, each holds its sender's last sequence number: %w", dedupe.ErrNoSweep)
}
