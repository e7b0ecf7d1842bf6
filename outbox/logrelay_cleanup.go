package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	// Deleted counts the messages-table rows the cleanup deleted.
	Deleted int64
	// Truncated counts the halves of the log table the cleanup emptied.
	Truncated int
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
	rot := rotation{old: -1}
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
			if err := r.rotateStep(ctx, &rot); err != nil && ctx.Err() == nil {
				r.log.Warn("outbox: log relay: log table cleanup", "err", err)
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

// rotation is the log table cleanup's state. Emits write to the half
// log_half names; the cleanup switches it to the other half, waits until
// every transaction that may have read the old value has ended, notes the
// WAL insert position then, and truncates the old half once the slot has
// confirmed that position: every message in it was published or parked
// (and a parked one copied to the messages table).
type rotation struct {
	old   int      // the half to truncate; -1 when none is pending
	vxids []string // the transactions running when old stopped taking rows
	lsn   LSN      // 0 while some of vxids run
}

// rotateStep moves the rotation on as far as it can.
func (r *LogRelay) rotateStep(ctx context.Context, rot *rotation) error {
	if rot.old < 0 {
		var cur int
		var has [2]bool
		err := r.pool.QueryRow(ctx, `SELECT (SELECT half FROM `+r.t.logHalf+`),
    EXISTS (SELECT 1 FROM `+r.t.logParts[0]+`), EXISTS (SELECT 1 FROM `+r.t.logParts[1]+`)`).Scan(&cur, &has[0], &has[1])
		if err != nil {
			return err
		}
		switch other := 1 - cur; {
		case has[other]:
			// Left by a relay that stopped before it truncated it.
			rot.old = other
		case has[cur]:
			tag, err := r.pool.Exec(ctx, `UPDATE `+r.t.logHalf+` SET half = $1 WHERE half = $2`, other, cur)
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 1 {
				return fmt.Errorf("outbox: log relay: %s does not hold one row with half %d", r.t.logHalf, cur)
			}
			rot.old = cur
		default:
			return nil
		}
		// Every transaction running now may have read the old half: each
		// holds the lock of its own virtual transaction ID, and a prepared
		// one keeps its locks (with no process) until it is committed.
		err = r.pool.QueryRow(ctx, `SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') FROM pg_locks
WHERE granted AND (locktype = 'virtualxid' OR pid IS NULL) AND pid IS DISTINCT FROM pg_backend_pid()`).Scan(&rot.vxids)
		if err != nil {
			rot.old = -1
			return err
		}
		rot.lsn = 0
	}
	if rot.lsn == 0 {
		var ended bool
		var lsn string
		err := r.pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_locks WHERE virtualtransaction = ANY($1)),
    pg_current_wal_insert_lsn()::text`, rot.vxids).Scan(&ended, &lsn)
		if err != nil || !ended {
			return err
		}
		if rot.lsn, err = pglogrepl.ParseLSN(lsn); err != nil {
			return err
		}
	}
	if uint64(rot.lsn) > r.confirmed.Load() {
		return nil
	}
	if err := r.truncateHalf(ctx, rot.old); err != nil {
		return err
	}
	r.count(func(s *LogStats) { s.Truncated++ })
	r.log.Debug("outbox: log relay: truncated a half of the log table", "half", rot.old)
	rot.old, rot.vxids, rot.lsn = -1, nil, 0
	return nil
}

// truncateHalf empties half of the log table: TRUNCATE, or DELETE when
// the relay's role may not truncate it (docs/pipelines.md says what to
// grant).
func (r *LogRelay) truncateHalf(ctx context.Context, half int) error {
	err := pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `TRUNCATE `+r.t.logParts[half])
		return err
	})
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege
		_, err = r.pool.Exec(ctx, `DELETE FROM `+r.t.logParts[half])
	}
	if err != nil {
		return fmt.Errorf("outbox: log relay: empty half %d of the log table: %w", half, err)
	}
	return nil
}
