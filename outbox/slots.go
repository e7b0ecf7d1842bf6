package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5/pgtype"
)

// SlotStatus is a log relay's replication slot as the server sees it, for
// operators and health checks: it is read from the server, so it tells
// the truth when no relay runs.
type SlotStatus struct {
	// Slot is the slot's name (LogRelayConfig.Slot).
	Slot string
	// Exists is false when the outbox knows the slot (a relay created it)
	// and the server has no such slot: it was dropped, or lost in a
	// failover to a standby (before PostgreSQL 17). The next relay to start
	// creates it again and publishes again, from the table, every message
	// not known published (duplicates with the same IDs, nothing lost).
	Exists bool
	// Ready is false while a relay has created the slot and not yet
	// published what the slot cannot deliver.
	Ready bool
	// Active reports whether a relay reads the slot now.
	Active bool
	// WALStatus is the server's pg_replication_slots.wal_status: reserved
	// or extended (fine), unreserved (past max_slot_wal_keep_size, about to
	// be invalidated) or lost (invalidated: the relay recreates the slot
	// and republishes from the table). Empty when the slot does not exist.
	WALStatus string
	// LagBytes is how far the slot's confirmed position is behind the
	// server's WAL insert position (on a standby, its replay position): the
	// WAL written since the last position every message before which was
	// published.
	LagBytes int64
	// RetainedBytes is the WAL the server keeps on disk for the slot (from
	// its restart position), which grows while the slot is behind or no
	// relay reads it.
	RetainedBytes int64
	// SafeWALBytes is how much more WAL can be written before the slot is
	// invalidated by max_slot_wal_keep_size; -1 when that is unlimited.
	SafeWALBytes int64
	// ConfirmLag is the time the reading relay took to confirm the WAL it
	// was last sent (pg_stat_replication.flush_lag): about the age of the
	// oldest commit it has not confirmed. 0 when no relay reads, when it
	// is caught up, or when the role may not see it (pg_read_all_stats).
	ConfirmLag time.Duration
}

// Slots reads the status of the log relays' slots the outbox knows (those
// a relay created on its table) in one statement; the outbox's slots table
// and pg_replication_slots are readable without privileges.
func (o *Outbox) Slots(ctx context.Context, db pg.DB) ([]SlotStatus, error) {
	rows, err := db.Query(ctx, `WITH here AS (
    SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() END AS lsn
)
SELECT s.slot, s.ready, r.slot_name IS NOT NULL, coalesce(r.active, false), coalesce(r.wal_status, ''),
    coalesce((here.lsn - r.confirmed_flush_lsn)::bigint, 0),
    coalesce((here.lsn - r.restart_lsn)::bigint, 0),
    coalesce(r.safe_wal_size, -1),
    (SELECT flush_lag FROM pg_stat_replication WHERE pid = r.active_pid)
FROM `+o.t.slots+` s CROSS JOIN here
LEFT JOIN pg_replication_slots r ON r.slot_name = s.slot AND r.database = current_database()
ORDER BY s.slot`)
	if err != nil {
		return nil, fmt.Errorf("outbox: slots: %w", err)
	}
	defer rows.Close()
	var out []SlotStatus
	for rows.Next() {
		var s SlotStatus
		var lag pgtype.Interval
		if err := rows.Scan(&s.Slot, &s.Ready, &s.Exists, &s.Active, &s.WALStatus, &s.LagBytes, &s.RetainedBytes, &s.SafeWALBytes, &lag); err != nil {
			return nil, fmt.Errorf("outbox: slots: %w", err)
		}
		if lag.Valid {
			s.ConfirmLag = time.Duration(lag.Microseconds)*time.Microsecond +
				time.Duration(lag.Days)*24*time.Hour
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: slots: %w", err)
	}
	return out, nil
}

// SlotProblems are the thresholds SlotStatus.Problems checks.
type SlotProblems struct {
	// MaxLagBytes is the most LagBytes that is healthy. Defaults to 0:
	// not checked.
	MaxLagBytes int64
	// MaxConfirmLag is the most ConfirmLag that is healthy. Defaults to 0:
	// not checked.
	MaxConfirmLag time.Duration
	// AllowInactive accepts a slot no relay reads. Defaults to false: a
	// slot without a reader is a problem (no relay runs, so nothing is
	// published and the server keeps WAL for it).
	AllowInactive bool
}

// Problems returns what is wrong with the slot, in words an operator acts
// on, or nothing when it is healthy by p.
func (s SlotStatus) Problems(p SlotProblems) []string {
	var out []string
	switch {
	case !s.Exists:
		out = append(out, "the slot is gone (dropped, or lost in a failover): the next relay recreates it and publishes again every message not known published")
	case s.WALStatus == "lost":
		out = append(out, "the slot was invalidated (max_slot_wal_keep_size): the relay recreates it and publishes again every message not yet confirmed")
	case s.WALStatus == "unreserved":
		out = append(out, fmt.Sprintf("the slot is past max_slot_wal_keep_size and about to be invalidated (%d bytes retained)", s.RetainedBytes))
	}
	if s.Exists && !s.Ready {
		out = append(out, "the slot is not ready: its relay has not yet published what the slot cannot deliver")
	}
	if s.Exists && !s.Active && !p.AllowInactive {
		out = append(out, fmt.Sprintf("no relay reads the slot: nothing is published and the server keeps its WAL (%d bytes)", s.RetainedBytes))
	}
	if p.MaxLagBytes > 0 && s.LagBytes > p.MaxLagBytes {
		out = append(out, fmt.Sprintf("the slot is %d bytes behind (more than %d)", s.LagBytes, p.MaxLagBytes))
	}
	if p.MaxConfirmLag > 0 && s.ConfirmLag > p.MaxConfirmLag {
		out = append(out, fmt.Sprintf("the relay confirms %s behind (more than %s)", s.ConfirmLag.Round(time.Millisecond), p.MaxConfirmLag))
	}
	return out
}
