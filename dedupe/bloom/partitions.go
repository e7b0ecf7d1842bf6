package bloom

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
)

// partitionTimeLayout formats a slice start in a partition's name.
const partitionTimeLayout = "20060102t150405"

// partitionName is the unquoted name of the partition holding slice start.
func (s *Strategy) partitionName(start time.Time) string {
	return s.cfg.Table + "_" + start.UTC().Format(partitionTimeLayout)
}

// partitionStart parses a partition name made by partitionName.
func (s *Strategy) partitionStart(name string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(name, s.cfg.Table+"_")
	if !ok {
		return time.Time{}, false
	}
	t, err := time.ParseInLocation(partitionTimeLayout, rest, time.UTC)
	if err != nil || t.Format(partitionTimeLayout) != rest {
		return time.Time{}, false
	}
	return t, true
}

// Maintain keeps the partitions and the filters in step with the clock of
// the database: it creates the partitions of the current slice and of the
// PartitionsAhead slices after it, detaches and drops every partition whose
// whole slice is older than Retention (the filters of those slices are
// forgotten with them), and seals the slices that have closed since the
// last run, rebuilding their filters from the store. Run it before the
// first Claim and then regularly (RunMaintenance does). Several processes
// may run it at once.
func (s *Strategy) Maintain(ctx context.Context, db pg.DB) error {
	now, err := s.ensurePartitions(ctx, db)
	if err != nil {
		return err
	}
	dropErr := s.dropExpired(ctx, db, now)
	if n := s.filters.prune(s.liveFrom(now)); n > 0 {
		s.cfg.Logger.Debug("bloom: rotated filters out", "table", s.cfg.Table, "slices", n)
	}
	// A claim commits well within the slice after the one it wrote to;
	// what is older belongs to claims that rolled back.
	s.written.prune(s.sliceOf(now).Add(-s.cfg.Slice))
	if !s.cfg.DisableFilter {
		if err := s.seal(ctx, db, false); err != nil {
			return errors.Join(dropErr, err)
		}
	}
	return dropErr
}

// ensurePartitions creates the partitions from the current slice to
// PartitionsAhead slices ahead and returns the database's clock.
func (s *Strategy) ensurePartitions(ctx context.Context, db pg.DB) (time.Time, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("bloom: maintain: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var now time.Time
	if err := tx.QueryRow(ctx, `SELECT clock_timestamp() FROM (SELECT pg_advisory_xact_lock($1)) AS l`, s.maintKey).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("bloom: maintain: %w", err)
	}
	cur := s.sliceOf(now)
	created := 0
	for i := 0; i <= s.cfg.PartitionsAhead; i++ {
		start := cur.Add(time.Duration(i) * s.cfg.Slice)
		name := s.partitionName(start)
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`,
			pgx.Identifier{s.cfg.Schema, name}.Sanitize()).Scan(&exists); err != nil {
			return time.Time{}, fmt.Errorf("bloom: maintain: %w", err)
		}
		if exists {
			continue
		}
		// The bounds are formatted from time values, never from input.
		sql := fmt.Sprintf(`CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s')`,
			pgx.Identifier{s.cfg.Schema, name}.Sanitize(), s.parent,
			start.Format(time.RFC3339), start.Add(s.cfg.Slice).Format(time.RFC3339))
		if _, err := tx.Exec(ctx, sql); err != nil {
			return time.Time{}, fmt.Errorf("bloom: maintain: creating partition %s: %w", name, err)
		}
		created++
	}
	if err := tx.Commit(ctx); err != nil {
		return time.Time{}, fmt.Errorf("bloom: maintain: %w", err)
	}
	if created > 0 {
		s.cfg.Logger.Info("bloom: created partitions", "table", s.cfg.Table, "count", created)
	}
	return now, nil
}

type partition struct {
	name     string
	start    time.Time
	attached bool
	pending  bool // DETACH CONCURRENTLY was interrupted
}

// partitions lists the tables named like this strategy's partitions.
func (s *Strategy) partitions(ctx context.Context, db pg.DB) ([]partition, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, `SELECT c.relname, i.inhrelid IS NOT NULL, coalesce(i.inhdetachpending, false)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = to_regclass($3)
WHERE n.nspname = $1 AND c.relkind = 'r' AND left(c.relname, length($2)) = $2`,
		s.cfg.Schema, s.cfg.Table+"_", s.parent)
	if err != nil {
		return nil, err
	}
	var out []partition
	for rows.Next() {
		var p partition
		if err := rows.Scan(&p.name, &p.attached, &p.pending); err != nil {
			rows.Close()
			return nil, err
		}
		var ok bool
		if p.start, ok = s.partitionStart(p.name); ok {
			out = append(out, p)
		}
	}
	rows.Close()
	return out, rows.Err()
}

// dropExpired detaches (concurrently, so claims are not blocked) and drops
// the partitions whose whole slice ended Retention or more before now.
// One process drops at a time: the others skip their turn. The lock is held
// by a transaction on one connection while the detaches run on others (they
// cannot run inside a transaction), so db must be a pool.
func (s *Strategy) dropExpired(ctx context.Context, db pg.DB, now time.Time) error {
	horizon := now.Add(-s.cfg.Retention)
	parts, err := s.partitions(ctx, db)
	if err != nil {
		return fmt.Errorf("bloom: maintain: listing partitions: %w", err)
	}
	parts = slices.DeleteFunc(parts, func(p partition) bool { return p.start.Add(s.cfg.Slice).After(horizon) })
	if len(parts) == 0 {
		return nil
	}
	lock, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("bloom: maintain: %w", err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	var mine bool
	if err := lock.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, s.dropKey).Scan(&mine); err != nil {
		return fmt.Errorf("bloom: maintain: %w", err)
	}
	if !mine {
		return nil // another process is dropping them
	}
	if parts, err = s.partitions(ctx, db); err != nil { // again, now that no one else drops
		return fmt.Errorf("bloom: maintain: listing partitions: %w", err)
	}
	var errs []error
	for _, p := range parts {
		if p.start.Add(s.cfg.Slice).After(horizon) {
			continue
		}
		q := pgx.Identifier{s.cfg.Schema, p.name}.Sanitize()
		begin := time.Now()
		if p.attached {
			how := "CONCURRENTLY"
			if p.pending {
				how = "FINALIZE"
			}
			if _, err := db.Exec(ctx, `ALTER TABLE `+s.parent+` DETACH PARTITION `+q+` `+how); err != nil {
				errs = append(errs, fmt.Errorf("bloom: maintain: detaching %s: %w", p.name, err))
				continue
			}
		}
		if _, err := db.Exec(ctx, `DROP TABLE IF EXISTS `+q); err != nil {
			errs = append(errs, fmt.Errorf("bloom: maintain: dropping %s: %w", p.name, err))
			continue
		}
		s.stats.dropped.Add(1)
		s.cfg.Logger.Info("bloom: dropped expired partition", "table", s.cfg.Table,
			"partition", p.name, "slice", p.start, "took", time.Since(begin))
	}
	return errors.Join(errs...)
}

// RunMaintenance runs Maintain at once and then about four times a slice
// (at most once a minute, and just after every slice boundary) until ctx is
// done, when it returns nil. Errors are logged and retried at the next run.
func (s *Strategy) RunMaintenance(ctx context.Context, db pg.DB) error {
	every := min(s.cfg.Slice/4, time.Minute)
	for {
		if err := s.Maintain(ctx, db); err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("bloom: maintenance failed", "table", s.cfg.Table, "err", err)
		}
		now := time.Now()
		wait := every
		if next := s.sliceOf(now).Add(s.cfg.Slice).Add(50 * time.Millisecond).Sub(now); next < wait {
			wait = next
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}
