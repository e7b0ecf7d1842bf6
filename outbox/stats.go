package outbox

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5/pgtype"
)

// Stats is a snapshot of an outbox, for operators: what waits per sink
// and who holds the partitions.
type Stats struct {
	// Sinks has one entry per sink with rows in the table, by name.
	Sinks  []SinkStats
	Leases LeaseStats
	// Log counts what LogMode emits wrote to the log table.
	Log LogTableStats
}

// LogTableStats counts the log table's rows: LogMode emits, one row each,
// kept (published or not) until a LogRelay's cleanup empties their half
// once its slot has confirmed them. How far a relay has published is its
// slot's confirmed position (Outbox.Slots, LogRelay.Stats).
type LogTableStats struct {
	// Rows counts the emits and Messages their messages.
	Rows, Messages int64
	// OldestAge is the age of the oldest row, measured by the database's
	// clock; 0 when there is none. A value growing past a few cleanup
	// intervals means no log relay empties the table (none runs, its slot
	// is behind, or a transaction open since then holds the cleanup).
	OldestAge time.Duration
}

// SinkStats counts one sink's rows.
type SinkStats struct {
	Sink string
	// Waiting counts the rows the relays still have to publish: not
	// published, not parked (including rows held back behind a parked row
	// of their key, and rows waiting for a retry).
	Waiting int64
	// OldestWaitingAge is the age of the oldest waiting row, measured by
	// the database's clock; 0 when nothing waits.
	OldestWaitingAge time.Duration
	// Parked counts the rows the sink refused for good, waiting for a
	// redrive or a purge.
	Parked int64
	// Published counts the published rows the cleanup has not deleted yet.
	Published int64
}

// LeaseStats describes the virtual partitions' leases.
type LeaseStats struct {
	// Partitions is the number of virtual partitions (Partitions).
	Partitions int
	// Held counts the partitions leased to a relay now.
	Held int
	// Relays counts the relays holding at least one partition.
	Relays int
	// Expired counts the leases that ran out without being released (a
	// relay that died or stalled); another relay takes them over. Released
	// and never-held partitions are neither held nor expired.
	Expired int
	// RelaysAlive counts the relays that announced themselves recently,
	// holding partitions or not.
	RelaysAlive int
}

// Stats reads the outbox's counts in three statements. The per-sink
// counts read the whole messages table, and the log table's counts the
// whole log table: cheap while the cleanups keep them small, slower on a
// table that holds a long retention of published rows; it only reads.
func (o *Outbox) Stats(ctx context.Context, db pg.DB) (Stats, error) {
	var st Stats
	rows, err := db.Query(ctx, `SELECT sink,
    count(*) FILTER (WHERE published_at IS NULL AND parked_at IS NULL),
    COALESCE(extract(epoch FROM now() - min(created_at) FILTER (WHERE published_at IS NULL AND parked_at IS NULL)), 0)::float8,
    count(*) FILTER (WHERE parked_at IS NOT NULL),
    count(*) FILTER (WHERE published_at IS NOT NULL)
FROM `+o.t.messages+` GROUP BY sink ORDER BY sink`)
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var s SinkStats
		var age float64
		if err := rows.Scan(&s.Sink, &s.Waiting, &age, &s.Parked, &s.Published); err != nil {
			return Stats{}, fmt.Errorf("outbox: stats: %w", err)
		}
		s.OldestWaitingAge = time.Duration(math.Max(age, 0) * float64(time.Second))
		st.Sinks = append(st.Sinks, s)
	}
	if err := rows.Err(); err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	var logAge float64
	if err := db.QueryRow(ctx, `SELECT count(*), coalesce(sum(n), 0),
    coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM `+o.t.log).Scan(&st.Log.Rows, &st.Log.Messages, &logAge); err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	st.Log.OldestAge = time.Duration(math.Max(logAge, 0) * float64(time.Second))
	l := &st.Leases
	err = db.QueryRow(ctx, `SELECT count(*),
    count(*) FILTER (WHERE expires_at > now()),
    count(DISTINCT owner) FILTER (WHERE expires_at > now()),
    count(*) FILTER (WHERE expires_at <= now() AND expires_at <> '-infinity'),
    (SELECT count(*) FROM `+o.t.relays+` WHERE expires_at > now())
FROM `+o.t.leases).Scan(&l.Partitions, &l.Held, &l.Relays, &l.Expired, &l.RelaysAlive)
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	return st, nil
}

// Row is one unpublished row of the outbox table: a message waiting for a
// relay, or parked.
type Row struct {
	// ID is the row's ID, as Redrive and Purge take it.
	ID        int64
	Message   Message
	Seq       int64
	CreatedAt time.Time
	Attempts  int
	// LastError is the last transient error a sink gave, if any.
	LastError string
	// NextAttemptAt is when a row that failed transiently is tried again;
	// zero when it is not waiting for a retry.
	NextAttemptAt time.Time
	// ParkedAt and ParkReason are set on a parked row.
	ParkedAt   time.Time
	ParkReason string
}

// RowFilter selects the rows Rows returns.
type RowFilter struct {
	// Waiting selects the rows waiting for a relay instead of the parked
	// ones. Defaults to false: parked rows.
	Waiting bool
	// Sink, when set, selects that sink's rows. Defaults to every sink.
	Sink string
	// IDs, when set, selects those rows. Defaults to any.
	IDs []int64
	// Limit is the most rows returned. Defaults to 0: no limit.
	Limit int
}

// Rows lists parked rows, or waiting ones, oldest first, for operators.
// The waiting ones are the messages table's: messages of LogMode emits
// wait in the log table, as one row per emit, which Stats.Log counts.
func (o *Outbox) Rows(ctx context.Context, db pg.DB, f RowFilter) ([]Row, error) {
	state := `parked_at IS NOT NULL`
	if f.Waiting {
		state = `published_at IS NULL AND parked_at IS NULL`
	}
	var limit *int
	if f.Limit > 0 {
		limit = &f.Limit
	}
	rows, err := db.Query(ctx, `SELECT id, sink, key, seq, msg_id, value, headers, created_at, attempts,
    COALESCE(last_error, ''), next_attempt_at, parked_at, COALESCE(park_reason, '')
FROM `+o.t.messages+`
WHERE `+state+` AND ($1 = '' OR sink = $1) AND ($2::bigint[] IS NULL OR id = ANY($2))
ORDER BY id LIMIT $3`, f.Sink, f.IDs, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: rows: %w", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		var headers []byte
		var next, parked pgtype.Timestamptz
		if err := rows.Scan(&r.ID, &r.Message.Sink, &r.Message.Key, &r.Seq, &r.Message.ID, &r.Message.Value,
			&headers, &r.CreatedAt, &r.Attempts, &r.LastError, &next, &parked, &r.ParkReason); err != nil {
			return nil, fmt.Errorf("outbox: rows: %w", err)
		}
		if next.Valid {
			r.NextAttemptAt = next.Time
		}
		if parked.Valid {
			r.ParkedAt = parked.Time
		}
		if r.Message.Headers, err = decodeHeaders(headers); err != nil {
			return nil, fmt.Errorf("outbox: row %d: %w", r.ID, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: rows: %w", err)
	}
	return out, nil
}
