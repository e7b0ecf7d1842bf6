package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// LogStats is a LogRelay's state and counters since it started.
type LogStats struct {
	Slot, Owner string
	// Active reports whether this relay reads the slot now (the others
	// stand by).
	Active bool
	// Confirmed is the position up to which every committed message was
	// published or parked: what the slot confirms.
	Confirmed LSN
	// OldestUnconfirmed is the age of the oldest commit received and not
	// yet confirmed, from its commit time by the database's clock; 0 when
	// none waits.
	OldestUnconfirmed time.Duration
	// Published and Parked count messages; Recovered counts those
	// published from the table when a slot was created (a first start, or
	// after a loss).
	Published, Parked, Recovered int64
	// SlotsCreated counts the slots this relay created; SlotsLost those it
	// found dropped or invalidated. Reconnects counts streams that failed
	// and were opened again.
	SlotsCreated, SlotsLost, Reconnects int
	// Deleted counts the rows the cleanup deleted.
	Deleted int64
}

// LogHook is an optional RelayHook extension for a LogRelay, called every
// LogRelayConfig.LagInterval with its stats and the slot's lag in bytes
// (the WAL the server keeps for it), read by the reading relay only.
type LogHook interface {
	SlotLag(ctx context.Context, s LogStats, lagBytes int64)
}

// watermark is the cleanup's bound: every row with an id up to upto
// belongs to a transaction that had begun when it was taken. Once those
// transactions ended (their virtual transaction IDs are gone) and the
// slot confirmed past the WAL insert position of that moment (the insert
// position, not pg_current_wal_lsn, the write position, which an
// asynchronous commit's record can still be ahead of), every such row was
// published or parked, and the published ones are deleted.
type watermark struct {
	upto  int64
	vxids []string
	lsn   LSN // 0 while some of vxids run
}

// cleanupLoop deletes confirmed rows every CleanupInterval and reports the
// slot's lag every LagInterval, until ctx is done. Only the relay reading
// the slot does either.
func (r *LogRelay) cleanupLoop(ctx context.Context) {
	var w *watermark
	var from int64
	clean := time.NewTicker(r.cfg.CleanupInterval)
	defer clean.Stop()
	lag := time.NewTicker(r.cfg.LagInterval)
	defer lag.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-lag.C:
			if len(r.logh) == 0 || !r.Stats().Active {
				continue
			}
			n, err := r.Lag(ctx)
			if err != nil {
				if ctx.Err() == nil {
					r.log.Warn("outbox: log relay: lag", "err", err)
				}
				continue
			}
			st := r.Stats()
			for _, h := range r.logh {
				h.SlotLag(ctx, st, n)
			}
		case <-clean.C:
			if !r.Stats().Active {
				continue
			}
			var err error
			if w, from, err = r.cleanupStep(ctx, w, from); err != nil && ctx.Err() == nil {
				r.log.Warn("outbox: log relay: cleanup", "err", err)
			}
		}
	}
}

// cleanupStep moves the watermark on as far as it can: it deletes up to a
// confirmed one, notes the WAL position once its transactions ended, and
// takes a new one when none is pending.
func (r *LogRelay) cleanupStep(ctx context.Context, w *watermark, from int64) (*watermark, int64, error) {
	if w != nil && w.lsn == 0 {
		var ended bool
		var lsn string
		err := r.pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'virtualxid' AND virtualxid = ANY($1)),
    pg_current_wal_insert_lsn()::text`, w.vxids).Scan(&ended, &lsn)
		if err != nil {
			return w, from, err
		}
		if !ended {
			return w, from, nil
		}
		if w.lsn, err = pglogrepl.ParseLSN(lsn); err != nil {
			return w, from, err
		}
	}
	if w != nil && uint64(w.lsn) <= r.confirmed.Load() {
		n, err := r.deleteUpTo(ctx, from, w.upto)
		r.count(func(s *LogStats) { s.Deleted += n })
		if err != nil {
			return w, from, err
		}
		if n > 0 {
			r.log.Debug("outbox: log relay: cleanup", "deleted", n)
		}
		from, w = max(from, w.upto), nil
	}
	if w != nil {
		return w, from, nil
	}
	// A row's id is drawn after its transaction took the table's lock for
	// the insert, which it holds to its end: any transaction that may hold
	// a row with an id up to the largest visible one holds that lock now.
	var upto int64
	if err := r.pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM `+r.t.messages).Scan(&upto); err != nil {
		return nil, from, err
	}
	if upto <= from {
		return nil, from, nil // nothing new since the last cleanup
	}
	var vxids []string
	if err := r.pool.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') FROM pg_locks
WHERE locktype = 'relation' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND relation = $1::regclass AND mode = 'RowExclusiveLock' AND granted`,
		r.t.messages).Scan(&vxids); err != nil {
		return nil, from, err
	}
	return &watermark{upto: upto, vxids: vxids}, from, nil
}

// deleteUpTo deletes the rows with ids in (from, upto] that are neither
// parked nor waiting after a redrive, in id ranges of CleanupBatch, and
// returns how many it deleted.
func (r *LogRelay) deleteUpTo(ctx context.Context, from, upto int64) (int64, error) {
	if from == 0 {
		if err := r.pool.QueryRow(ctx, `SELECT coalesce(min(id) - 1, 0) FROM `+r.t.messages).Scan(&from); err != nil {
			return 0, fmt.Errorf("outbox: log relay: cleanup: %w", err)
		}
	}
	var total int64
	for lo := from; lo < upto; lo += int64(r.cfg.CleanupBatch) {
		hi := min(lo+int64(r.cfg.CleanupBatch), upto)
		tag, err := r.pool.Exec(ctx, `DELETE FROM `+r.t.messages+`
WHERE id > $1 AND id <= $2 AND (published_at IS NOT NULL OR (parked_at IS NULL AND last_error IS NULL))`,
			pgx.QueryExecModeExec, lo, hi)
		if err != nil {
			return total, fmt.Errorf("outbox: log relay: cleanup: %w", err)
		}
		total += tag.RowsAffected()
	}
	return total, nil
}
