package outbox

import (
	"context"
	"fmt"

	"github.com/effectively-once/effectively/consumer"
	"github.com/jackc/pgx/v5"
)

// Emit adds msgs to the outbox inside tx, in one statement whatever their
// number: they are published if and only if tx commits. A message without
// an ID gets a random one (inside a consumer's handler, use EmitFor or ID
// instead, so that the IDs survive a replay). Emit checks every message
// before writing any, and returns a *MessageError (wrapping ErrInvalid)
// for the first it refuses.
//
// Emit takes, for every (Sink, Key) it writes to, that key's counter row
// until tx ends: another transaction emitting to the same key waits for
// this one, which is what keeps the key's messages in commit order. Keep
// transactions that emit short.
func (o *Outbox) Emit(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	n := len(msgs)
	parts := make([]int32, n)
	sinks := make([]string, n)
	keys := make([][]byte, n)
	ids := make([]string, n)
	values := make([][]byte, n)
	headers := make([][]byte, n)
	for i := range msgs {
		m := &msgs[i]
		if err := o.validate(i, m); err != nil {
			return err
		}
		ids[i] = m.ID
		if ids[i] == "" {
			ids[i] = randomID()
		}
		sinks[i], keys[i], values[i] = m.Sink, m.Key, m.Value
		headers[i] = encodeHeaders(m.Headers)
		parts[i] = partition(m.Sink, m.Key, ids[i])
	}
	var written int64
	err := tx.QueryRow(ctx, o.t.emitSQL(), parts, sinks, keys, ids, values, headers, o.t.channel).Scan(&written)
	if err != nil {
		return fmt.Errorf("outbox: emit: %w", err)
	}
	if written != int64(n) {
		return fmt.Errorf("outbox: emit: wrote %d of %d messages", written, n)
	}
	return nil
}

// EmitFor is Emit for the messages emitted while applying the input in,
// from a consumer's handler: a message without an ID gets ID(in, i), i
// being its position in msgs. Call it once per input (or give the messages
// of later calls IDs with ID and ordinals of their own), so that every
// message of an input has its own ordinal.
func (o *Outbox) EmitFor(ctx context.Context, tx pgx.Tx, in *consumer.Message, msgs ...Message) error {
	for i := range msgs {
		if msgs[i].ID == "" {
			msgs[i].ID = ID(in, i)
		}
	}
	return o.Emit(ctx, tx, msgs...)
}

func (t tables) emitSQL() string {
	return `WITH input AS (
    SELECT * FROM unnest($1::int[], $2::text[], $3::bytea[], $4::text[], $5::bytea[], $6::bytea[])
        WITH ORDINALITY AS t(part, sink, key, msg_id, value, headers, ord)
), counts AS (
    SELECT sink, key, count(*) AS n FROM input WHERE key IS NOT NULL GROUP BY sink, key
), bumped AS (
    INSERT INTO ` + t.counters + ` AS c (sink, key, seq)
    SELECT sink, key, n FROM counts ORDER BY sink, key
    ON CONFLICT (sink, key) DO UPDATE SET seq = c.seq + excluded.seq
    RETURNING c.sink, c.key, c.seq
), ins AS (
    INSERT INTO ` + t.messages + ` (part, sink, key, seq, msg_id, value, headers)
    SELECT i.part, i.sink, i.key,
        CASE WHEN i.key IS NULL THEN 0
             ELSE b.seq - count(*) OVER w + row_number() OVER (w ORDER BY i.ord) END,
        i.msg_id, i.value, i.headers
    FROM input i LEFT JOIN bumped b ON b.sink = i.sink AND b.key = i.key
    WINDOW w AS (PARTITION BY i.sink, i.key)
    ORDER BY i.ord
    RETURNING 1
)
SELECT count(*) FROM (SELECT pg_notify($7, '')) AS n, ins`
}
