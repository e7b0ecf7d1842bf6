package outbox

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// adoptBatch is the most log table rows adoptLog moves in one transaction.
const adoptBatch = 100

// adoptLog moves the messages of LogMode emits from the log table, which
// only a LogRelay reads, into the messages table, where this Relay reads
// them: a keyless one is published, a keyed one is parked with
// ErrUnordered (no counter numbered it, so its key's order is unknown
// here). A LogMode outbox belongs with a LogRelay; this keeps one read by
// a Relay by mistake from losing its messages silently. It returns how
// many messages it moved.
func (r *Relay) adoptLog(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := r.adoptSome(ctx)
		total += n
		if err != nil || n == 0 {
			return total, err
		}
	}
}

func (r *Relay) adoptSome(ctx context.Context) (int, error) {
	var moved int
	err := pgx.BeginFunc(ctx, r.db, func(tx pgx.Tx) error {
		rs, err := tx.Query(ctx, `DELETE FROM `+r.t.log+` WHERE id IN (
    SELECT id FROM `+r.t.log+` ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
RETURNING id, body, created_at`, adoptBatch)
		if err != nil {
			return err
		}
		type logRow struct {
			id      int64
			body    []byte
			created time.Time
		}
		var got []logRow
		for rs.Next() {
			var x logRow
			if err := rs.Scan(&x.id, &x.body, &x.created); err != nil {
				rs.Close()
				return err
			}
			got = append(got, x)
		}
		rs.Close()
		if err := rs.Err(); err != nil {
			return err
		}
		slices.SortFunc(got, func(a, b logRow) int { return cmp.Compare(a.id, b.id) })
		var ins emitRows
		var created []time.Time
		for _, g := range got {
			xs, err := decodeLogBody(g.id, g.created, g.body)
			if err != nil {
				return err
			}
			for _, x := range xs {
				ins.parts = append(ins.parts, x.part)
				ins.sinks = append(ins.sinks, x.msg.Sink)
				ins.keys = append(ins.keys, x.msg.Key)
				ins.ids = append(ins.ids, x.msg.ID)
				ins.values = append(ins.values, x.msg.Value)
				ins.headers = append(ins.headers, encodeHeaders(x.msg.Headers))
				created = append(created, x.created)
			}
		}
		if len(ins.ids) > 0 {
			if _, err := tx.Exec(ctx, `INSERT INTO `+r.t.messages+` (part, sink, key, seq, msg_id, value, headers, created_at)
SELECT part, sink, key, 0, msg_id, value, headers, created
FROM unnest($1::int[], $2::text[], $3::bytea[], $4::text[], $5::bytea[], $6::bytea[], $7::timestamptz[])
    WITH ORDINALITY AS x(part, sink, key, msg_id, value, headers, created, ord)
ORDER BY ord`, ins.parts, ins.sinks, ins.keys, ins.ids, ins.values, ins.headers, created); err != nil {
				return err
			}
		}
		moved = len(ins.ids)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("outbox: move LogMode messages to the messages table: %w", err)
	}
	if moved > 0 {
		r.log.Error("outbox: the relay found messages emitted in LogMode, which a LogRelay reads; moved them to the messages table: keyless ones are published, keyed ones parked (ErrUnordered). Set Config.Mode = TableMode on the emitters, or run a LogRelay instead",
			"owner", r.owner, "messages", moved)
	}
	return moved, nil
}
