package outbox

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ensurePublication creates the publication of the outbox's inserts (the
// messages table and the log table) when it does not exist, and adds the
// log table to one that lacks it (made before the log table existed).
// Either needs ownership of the tables; a DBA may create the publication
// beforehand instead (docs/pipelines.md).
func (r *LogRelay) ensurePublication(ctx context.Context) error {
	var hasLog bool
	err := r.pool.QueryRow(ctx, `SELECT p.puballtables OR EXISTS (
    SELECT 1 FROM pg_publication_rel pr WHERE pr.prpubid = p.oid AND pr.prrelid = $2::regclass)
FROM pg_publication p WHERE p.pubname = $1`, r.cfg.Publication, r.t.log).Scan(&hasLog)
	name := pgx.Identifier{r.cfg.Publication}.Sanitize()
	switch {
	case err == nil && hasLog:
		return nil
	case err == nil:
		if _, err := r.pool.Exec(ctx, `ALTER PUBLICATION `+name+` ADD TABLE `+r.t.log); err != nil {
			return fmt.Errorf("outbox: log relay: add the log table %s to publication %s: %w", r.t.log, r.cfg.Publication, err)
		}
		r.log.Info("outbox: added the log table to the publication", "publication", r.cfg.Publication, "table", r.t.log)
		return nil
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("outbox: log relay: publication: %w", err)
	}
	_, err = r.pool.Exec(ctx, `CREATE PUBLICATION `+name+
		` FOR TABLE `+r.t.messages+`, `+r.t.log+` WITH (publish = 'insert')`)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42710" { // created meanwhile by another relay
		return nil
	}
	if err != nil {
		return fmt.Errorf("outbox: log relay: create publication %s: %w", r.cfg.Publication, err)
	}
	r.log.Info("outbox: created the publication of the outbox's inserts", "publication", r.cfg.Publication)
	return nil
}

// slotInvalidated reports whether err says the slot can no longer deliver
// changes (PostgreSQL 13+: invalidated by max_slot_wal_keep_size).
func slotInvalidated(pe *pgconn.PgError) bool {
	return pe.Code == "55000" && (strings.Contains(pe.Message, "can no longer get changes") ||
		strings.Contains(pe.Detail, "invalidated") || strings.Contains(pe.Message, "invalidated"))
}

// prepareSlot returns where to start reading the slot: 0 (its confirmed
// position) when it exists and can deliver. Otherwise the slot is gone
// (dropped, lost with a failover to a standby before PostgreSQL 17) or
// invalidated (max_slot_wal_keep_size): prepareSlot drops what is left of
// it, creates it again, republishes from the table every message the
// new slot will not deliver and is not known published (everything
// committed before the slot's consistent point that the cleanup has not
// deleted), and returns the consistent point. The rows kept until the slot
// confirmed them are what makes a lost slot lose nothing; a message
// published before the loss is published again, with the same ID.
func (r *LogRelay) prepareSlot(ctx context.Context, conn *pgconn.PgConn) (LSN, error) {
	var status, db, confirmed string
	err := r.pool.QueryRow(ctx, `SELECT coalesce(wal_status, ''), coalesce(database, ''), coalesce(confirmed_flush_lsn::text, '')
FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.Slot).Scan(&status, &db, &confirmed)
	exists := err == nil
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, err
	}
	var here string
	if err := r.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&here); err != nil {
		return 0, err
	}
	if exists && db != here {
		return 0, &slotElsewhereError{slot: r.cfg.Slot, db: db, here: here}
	}
	if exists && status != "lost" {
		r.seen = true
		var ready bool
		err := r.pool.QueryRow(ctx, `SELECT ready FROM `+r.t.slots+` WHERE slot = $1`, r.cfg.Slot).Scan(&ready)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return 0, err
		}
		if !ready {
			// Created by a relay that stopped before it had published what the
			// slot cannot deliver, or by hand: publish what the table holds,
			// in a snapshot of now. What the slot delivers after that is
			// published again, after it: duplicates, never a reordering.
			r.log.Warn("outbox: the replication slot was never made ready; publishing first what the outbox table holds", "slot", r.cfg.Slot)
			if err := r.recover(ctx, ""); err != nil {
				return 0, err
			}
		}
		if lsn, err := pglogrepl.ParseLSN(confirmed); err == nil {
			r.advance(lsn)
		}
		return 0, nil
	}
	if exists {
		r.log.Error("outbox: the replication slot was invalidated (max_slot_wal_keep_size): recreating it and publishing again, with the same IDs, every message not yet confirmed",
			"slot", r.cfg.Slot)
		if err := pglogrepl.DropReplicationSlot(ctx, conn, r.cfg.Slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
			return 0, fmt.Errorf("outbox: log relay: drop invalidated slot: %w", err)
		}
		r.count(func(s *LogStats) { s.SlotsLost++ })
	} else if r.seen {
		r.log.Error("outbox: the replication slot is gone (dropped, or lost in a failover): recreating it and publishing again, with the same IDs, every message not yet confirmed",
			"slot", r.cfg.Slot)
		r.count(func(s *LogStats) { s.SlotsLost++ })
	} else {
		r.log.Info("outbox: creating the replication slot; publishing first what the outbox table holds", "slot", r.cfg.Slot)
	}
	if _, err := r.pool.Exec(ctx, `INSERT INTO `+r.t.slots+` (slot, ready) VALUES ($1, false)
ON CONFLICT (slot) DO UPDATE SET ready = false, created_at = now()`, r.cfg.Slot); err != nil {
		return 0, err
	}
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, r.cfg.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT"})
	if err != nil {
		return 0, fmt.Errorf("outbox: log relay: create slot %s: %w", r.cfg.Slot, err)
	}
	r.seen = true
	r.count(func(s *LogStats) { s.SlotsCreated++ })
	start, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		return 0, fmt.Errorf("outbox: log relay: slot's consistent point: %w", err)
	}
	if err := r.recover(ctx, res.SnapshotName); err != nil {
		return 0, err
	}
	r.advance(start)
	return start, nil
}

// recover publishes what the table holds for the log relay (recoverFrom)
// and then marks the slot ready.
func (r *LogRelay) recover(ctx context.Context, snapshot string) error {
	n, err := r.recoverFrom(ctx, snapshot)
	if err != nil {
		return err
	}
	if n > 0 {
		r.log.Warn("outbox: published the outbox table's unconfirmed messages before reading the slot", "slot", r.cfg.Slot, "messages", n)
	}
	_, err = r.pool.Exec(ctx, `INSERT INTO `+r.t.slots+` (slot, ready) VALUES ($1, true)
ON CONFLICT (slot) DO UPDATE SET ready = true`, r.cfg.Slot)
	return err
}

var snapshotName = regexp.MustCompile(`^[0-9A-Fa-f-]+$`)

// recoverFrom publishes, in the snapshot the new slot exported (every
// transaction before its consistent point, none after) or, with none, in
// a snapshot of now, the messages waiting for the log relay: first the
// messages table's rows not published, not parked, not redriven (the
// reconciliation publishes those), then every message of the log table's
// rows (the cleanup truncates a half only once the slot confirmed it, so
// what it holds is everything not known published). The messages table's
// rows come per key in seq order, which is commit order, and in id order
// among rows of one seq (rows of seq 0 were written by LogMode emits of
// an earlier version): insertion order, which is commit order but for
// transactions that emitted to one key at the same time; so do the log
// table's rows. A key's messages-table rows come before its log-table
// ones, and its TableMode rows (seq from 1) before its seq-0 rows: an
// outbox moving to the log relay switches its emitters from TableMode to
// LogMode, so the LogMode rows are the newer.
// It returns how many it published.
func (r *LogRelay) recoverFrom(ctx context.Context, snapshot string) (int64, error) {
	if snapshot != "" && !snapshotName.MatchString(snapshot) {
		return 0, fmt.Errorf("outbox: log relay: unexpected snapshot name %q", snapshot)
	}
	if err := r.reconcile(ctx); err != nil {
		return 0, err
	}
	tx, err := r.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if snapshot != "" {
		if _, err := tx.Exec(ctx, `SET TRANSACTION SNAPSHOT '`+snapshot+`'`); err != nil {
			return 0, fmt.Errorf("outbox: log relay: import the slot's snapshot: %w", err)
		}
	}
	rows, err := tx.Query(ctx, `SELECT id, part, sink, key, seq, msg_id, value, headers, created_at
FROM `+r.t.messages+`
WHERE published_at IS NULL AND parked_at IS NULL AND last_error IS NULL
ORDER BY part, sink, key, seq = 0, seq, id`, pgx.QueryExecModeExec)
	if err != nil {
		return 0, fmt.Errorf("outbox: log relay: recover: %w", err)
	}
	defer rows.Close()
	var total int64
	var buf []row
	flush := func() error {
		if len(buf) == 0 {
			return nil
		}
		published, err := r.publishRows(ctx, buf)
		total += int64(len(published))
		if err != nil {
			return err
		}
		buf = buf[:0]
		return nil
	}
	for rows.Next() {
		var x row
		var headers []byte
		if err := rows.Scan(&x.id, &x.part, &x.msg.Sink, &x.msg.Key, &x.seq, &x.msg.ID, &x.msg.Value, &headers, &x.created); err != nil {
			return total, fmt.Errorf("outbox: log relay: recover: %w", err)
		}
		if x.msg.Headers, err = decodeHeaders(headers); err != nil {
			return total, fmt.Errorf("outbox: log relay: recover row %d: %w", x.id, err)
		}
		buf = append(buf, x)
		if len(buf) == r.cfg.BatchSize {
			if err := flush(); err != nil {
				return total, err
			}
		}
	}
	if err := rows.Err(); err != nil {
		return total, fmt.Errorf("outbox: log relay: recover: %w", err)
	}
	rows.Close()
	if err := flush(); err != nil {
		return total, err
	}
	// Then the log table's rows, in id order: each holds one LogMode
	// emit's messages. A key's messages-table rows (TableMode) come first:
	// the LogMode ones are the newer.
	logRows, err := tx.Query(ctx, `SELECT id, body, created_at FROM `+r.t.log+` ORDER BY id`, pgx.QueryExecModeExec)
	if err != nil {
		return total, fmt.Errorf("outbox: log relay: recover: %w", err)
	}
	defer logRows.Close()
	for logRows.Next() {
		var id int64
		var body []byte
		var created time.Time
		if err := logRows.Scan(&id, &body, &created); err != nil {
			return total, fmt.Errorf("outbox: log relay: recover: %w", err)
		}
		xs, err := decodeLogBody(id, created, body)
		if err != nil {
			return total, fmt.Errorf("outbox: log relay: recover: %w", err)
		}
		buf = append(buf, xs...)
		if len(buf) >= r.cfg.BatchSize {
			if err := flush(); err != nil {
				return total, err
			}
		}
	}
	if err := logRows.Err(); err != nil {
		return total, fmt.Errorf("outbox: log relay: recover: %w", err)
	}
	if err := flush(); err != nil {
		return total, err
	}
	r.count(func(s *LogStats) { s.Recovered += total })
	return total, nil
}

// Lag reads how far the slot's confirmed position is behind the server's
// current WAL position, in bytes: the WAL the server keeps for the slot.
func (r *LogRelay) Lag(ctx context.Context) (int64, error) {
	var lag int64
	err := r.pool.QueryRow(ctx, `SELECT coalesce((pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, 0)
FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.Slot).Scan(&lag)
	if err != nil {
		return 0, fmt.Errorf("outbox: log relay: lag: %w", err)
	}
	return lag, nil
}

// slotElsewhereError: the slot's name is taken in another database. Run
// stops with it: trying again cannot help.
type slotElsewhereError struct{ slot, db, here string }

func (e *slotElsewhereError) Error() string {
	return fmt.Sprintf("outbox: log relay: slot %s belongs to database %q, not %q: set LogRelayConfig.Slot", e.slot, e.db, e.here)
}
