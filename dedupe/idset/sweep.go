package idset

import (
	"context"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/pg"
)

// sweepSQL deletes up to $2 markers older than $1 microseconds. Rows locked
// by another sweeper are skipped rather than waited for.
func sweepSQL(table string) string {
	return `DELETE FROM ` + table + ` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM ` + table + `
    WHERE processed_at < now() - $1::bigint * interval '1 microsecond'
    LIMIT $2
    FOR UPDATE SKIP LOCKED))`
}

// Sweep deletes the markers older than the retention, in batches of at
// most SweepBatch markers, each batch a statement of its own committed
// before the next begins. It stops after a batch that deleted fewer than
// SweepBatch markers, or when ctx is done, and returns how many markers it
// deleted in all.
func (s *Strategy) Sweep(ctx context.Context, db pg.DB) (deleted int64, err error) {
	retention := s.cfg.Retention.Microseconds()
	batch := int64(s.cfg.SweepBatch)
	for {
		if err := ctx.Err(); err != nil {
			return deleted, fmt.Errorf("idset: sweep: %w", err)
		}
		tag, err := db.Exec(ctx, s.sweepSQL, retention, batch)
		if err != nil {
			return deleted, fmt.Errorf("idset: sweep: %w", err)
		}
		n := tag.RowsAffected()
		deleted += n
		if n < batch {
			return deleted, nil
		}
	}
}

// RunSweeper sweeps expired markers at once and then every SweepInterval
// until ctx is done, and then returns nil. It logs what it removed at Info
// level; a failed sweep is logged at Warn level and tried again at the
// next interval.
func (s *Strategy) RunSweeper(ctx context.Context, db pg.DB) error {
	ticker := time.NewTicker(s.cfg.SweepInterval)
	defer ticker.Stop()
	table := s.cfg.Schema + "." + s.cfg.Table
	for {
		begin := time.Now()
		n, err := s.Sweep(ctx, db)
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case err != nil:
			s.log.Warn("idset: sweep failed", "table", table, "deleted", n, "error", err)
		case n > 0:
			s.log.Info("idset: swept expired markers", "table", table, "deleted", n,
				"retention", s.cfg.Retention, "took", time.Since(begin).Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// Maintain does nothing: idset needs no upkeep before it claims. With
// RunMaintenance it makes Strategy a dedupe.Maintainer, so that consumers
// run the sweeper.
func (s *Strategy) Maintain(context.Context, pg.DB) error { return nil }

// RunMaintenance runs RunSweeper until ctx is done, unless
// Config.ManualSweep is set (dedupe.Maintainer).
func (s *Strategy) RunMaintenance(ctx context.Context, db pg.DB) error {
	if s.cfg.ManualSweep {
		return nil
	}
	return s.RunSweeper(ctx, db)
}
