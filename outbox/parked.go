package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/pg"
)

// Parked is a message a sink refused for good. It holds back the later
// messages of its (Sink, Key) until it is redriven or purged.
type Parked struct {
	// Row is the message's row ID in the outbox table.
	Row      int64
	Message  Message
	Seq      int64
	Attempts int
	Reason   string
	ParkedAt time.Time
}

// Parked lists up to limit parked messages, oldest first.
func (o *Outbox) Parked(ctx context.Context, db pg.DB, limit int) ([]Parked, error) {
	rows, err := db.Query(ctx, `SELECT id, sink, key, seq, msg_id, value, headers, attempts, park_reason, parked_at
FROM `+o.t.messages+` WHERE parked_at IS NOT NULL ORDER BY id LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: parked: %w", err)
	}
	defer rows.Close()
	var out []Parked
	for rows.Next() {
		var p Parked
		var headers []byte
		if err := rows.Scan(&p.Row, &p.Message.Sink, &p.Message.Key, &p.Seq, &p.Message.ID, &p.Message.Value,
			&headers, &p.Attempts, &p.Reason, &p.ParkedAt); err != nil {
			return nil, fmt.Errorf("outbox: parked: %w", err)
		}
		if p.Message.Headers, err = decodeHeaders(headers); err != nil {
			return nil, fmt.Errorf("outbox: parked row %d: %w", p.Row, err)
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: parked: %w", err)
	}
	return out, nil
}

// Redrive puts parked messages back in line, and wakes the relays: they
// publish them, and then their keys' later messages. It returns how many it
// found parked.
func (o *Outbox) Redrive(ctx context.Context, db pg.DB, rows ...int64) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `WITH r AS (
    UPDATE `+o.t.messages+`
    SET parked_at = NULL, park_reason = NULL, attempts = 0, next_attempt_at = NULL
    WHERE id = ANY($1) AND parked_at IS NOT NULL
    RETURNING 1)
SELECT count(*) FROM (SELECT pg_notify($2, '')) AS n, r`, rows, o.t.channel).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("outbox: redrive: %w", err)
	}
	return n, nil
}

// Purge deletes parked messages for good, releasing their keys' later
// messages. It returns how many it found parked.
func (o *Outbox) Purge(ctx context.Context, db pg.DB, rows ...int64) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `WITH d AS (
    DELETE FROM `+o.t.messages+` WHERE id = ANY($1) AND parked_at IS NOT NULL RETURNING 1)
SELECT count(*) FROM (SELECT pg_notify($2, '')) AS n, d`, rows, o.t.channel).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("outbox: purge: %w", err)
	}
	return n, nil
}
