package outbox

import (
	"context"
	"fmt"

	"github.com/effectively-once/effectively/consumer"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Emit adds msgs to the outbox inside tx, in one statement whatever their
// number: they are published if and only if tx commits. A message without
// an ID gets a random one (inside a consumer's handler, use EmitFor or ID
// instead, so that the IDs survive a replay). Emit checks every message
// before writing any, and returns a *MessageError (wrapping ErrInvalid)
// for the first it refuses.
//
// In LogMode (the default) that statement inserts one row of the log
// table, holding all of msgs (at most 1,048,576 of them). In
// TableMode, Emit also takes, for every (Sink, Key) it writes to, that
// key's counter row until tx ends: another transaction emitting to the
// same key waits for this one, which is what keeps the key's messages in
// commit order for the table-polling Relay. Keep transactions that emit
// short there.
func (o *Outbox) Emit(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	if len(msgs) == 0 {
		return nil
	}
	rs, err := o.rows(msgs, nil)
	if err != nil {
		return err
	}
	n := len(msgs)
	var written int64
	switch {
	case o.cfg.Mode == TableMode:
		err = tx.QueryRow(ctx, o.sql, o.args(&rs)...).Scan(&written)
	case n > maxLogEmit:
		return fmt.Errorf("outbox: emit: %d messages in one call, more than %d", n, maxLogEmit)
	default:
		var tag pgconn.CommandTag
		tag, err = tx.Exec(ctx, o.sql, o.args(&rs)...)
		if written = tag.RowsAffected(); err == nil && written == 1 {
			written = int64(n) // one log row holds them all
		}
	}
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

// emitRows are messages as the emit statement takes them: one array per
// column.
type emitRows struct {
	parts           []int32
	sinks, ids      []string
	keys            [][]byte
	values, headers [][]byte
}

// rows checks msgs and returns them as columns. A message without an ID
// gets id(i), or a random one when id is nil.
func (o *Outbox) rows(msgs []Message, id func(i int) string) (emitRows, error) {
	n := len(msgs)
	rs := emitRows{parts: make([]int32, n), sinks: make([]string, n), ids: make([]string, n),
		keys: make([][]byte, n), values: make([][]byte, n), headers: make([][]byte, n)}
	for i := range msgs {
		m := &msgs[i]
		if err := o.validate(i, m); err != nil {
			return emitRows{}, err
		}
		rs.ids[i] = m.ID
		if rs.ids[i] == "" {
			if id != nil {
				rs.ids[i] = id(i)
			} else {
				rs.ids[i] = randomID()
			}
		}
		rs.sinks[i], rs.keys[i], rs.values[i] = m.Sink, m.Key, m.Value
		rs.headers[i] = encodeHeaders(m.Headers)
		rs.parts[i] = partition(m.Sink, m.Key, rs.ids[i])
	}
	return rs, nil
}

// append adds the rows of more after those of rs.
func (rs *emitRows) append(more *emitRows) {
	rs.parts = append(rs.parts, more.parts...)
	rs.sinks = append(rs.sinks, more.sinks...)
	rs.ids = append(rs.ids, more.ids...)
	rs.keys = append(rs.keys, more.keys...)
	rs.values = append(rs.values, more.values...)
	rs.headers = append(rs.headers, more.headers...)
}

// args are the emit statement's arguments for rs.
func (o *Outbox) args(rs *emitRows) []any {
	if o.cfg.Mode != TableMode {
		return []any{len(rs.ids), encodeLogBody(rs)}
	}
	// Each keyed message's place among its key's messages in this call
	// (from 1), and how many the key has: the statement takes a block of
	// that many numbers from the key's counter and gives the messages its
	// numbers in this order, with no sort in the database.
	ords, counts := keyOrdinals(rs.sinks, rs.keys)
	return []any{rs.parts, rs.sinks, rs.keys, rs.ids, rs.values, rs.headers, ords, counts, o.t.channel}
}

// keyOrdinals returns, for each message with a key, its place among the
// messages of its (sink, key) (from 1) and their number; 0 and 0 for one
// without a key.
func keyOrdinals(sinks []string, keys [][]byte) (ords, counts []int32) {
	ords = make([]int32, len(keys))
	counts = make([]int32, len(keys))
	seen := make(map[string]int32, len(keys))
	for i, k := range keys {
		if k != nil {
			id := sinks[i] + "\x00" + string(k)
			seen[id]++
			ords[i] = seen[id]
		}
	}
	for i, k := range keys {
		if k != nil {
			counts[i] = seen[sinks[i]+"\x00"+string(k)]
		}
	}
	return ords, counts
}

// emitSQL is the emit statement of mode. In LogMode, one row of the log
// table, in its current half, holding every message: the LogRelay orders
// by commit, and needs neither a counter nor a NOTIFY. In TableMode, the
// counters give each keyed row its seq, and the NOTIFY (delivered on
// commit) wakes the Relay.
func (t tables) emitSQL(mode Mode) string {
	if mode != TableMode {
		// The half is a scalar subquery: a log_half table emptied by hand
		// fails the INSERT (half is NOT NULL) instead of inserting nothing.
		return `INSERT INTO ` + t.log + ` (half, n, body) VALUES ((SELECT half FROM ` + t.logHalf + `), $1, $2)`
	}
	return `WITH input AS (
    SELECT * FROM unnest($1::int[], $2::text[], $3::bytea[], $4::text[], $5::bytea[], $6::bytea[], $7::int[], $8::int[])
        AS t(part, sink, key, msg_id, value, headers, ord, n)
), bumped AS (
    INSERT INTO ` + t.counters + ` AS c (sink, key, seq)
    SELECT sink, key, n FROM input WHERE ord = 1 ORDER BY sink, key
    ON CONFLICT (sink, key) DO UPDATE SET seq = c.seq + excluded.seq
    RETURNING c.sink, c.key, c.seq
), ins AS (
    INSERT INTO ` + t.messages + ` (part, sink, key, seq, msg_id, value, headers)
    SELECT i.part, i.sink, i.key, CASE WHEN i.key IS NULL THEN 0 ELSE b.seq - i.n + i.ord END,
        i.msg_id, i.value, i.headers
    FROM input i LEFT JOIN bumped b ON b.sink = i.sink AND b.key = i.key
    RETURNING 1
)
SELECT count(*) FROM (SELECT pg_notify($9, '')) AS n, ins`
}
