package outbox

import (
	"context"
	"fmt"
	"time"
)

// row is one outbox row a relay read.
type row struct {
	id       int64
	part     int32
	seq      int64
	attempts int
	created  time.Time
	msg      Message
}

// fetch reads up to limit publishable rows of parts: unpublished, not
// parked, not waiting for a retry, and with no such row before them in
// their key. They come per key in seq order, and each key's rows are a
// prefix of its unpublished ones, so publishing them in that order keeps
// commit order.
//
// The statement's snapshot is the read position: a row whose transaction
// commits later is read by a later fetch, and a transaction still open
// holds back only the keys it emitted to (their counter rows are locked, so
// no later row of those keys can be committed before it).
func (r *Relay) fetch(ctx context.Context, parts []int32, limit int) ([]row, error) {
	m := r.t.messages
	// Each partition is read through its own index range, at most perPart
	// rows of it, so a pass costs the rows it may publish, not the whole
	// backlog. perPart rows are a prefix per key of each partition's
	// eligible rows, and the outer order truncates them by the same order,
	// so each key's rows stay a prefix of its unpublished ones.
	perPart := limit
	if len(parts) > 1 {
		perPart = max(2*limit/len(parts), min(limit, 64))
	}
	rows, err := r.db.Query(ctx, `SELECT o.id, o.part, o.sink, o.key, o.seq, o.msg_id, o.value, o.headers, o.attempts, o.created_at
FROM unnest($1::int[]) AS q(part), LATERAL (
    SELECT * FROM `+m+` o
    WHERE o.part = q.part AND o.published_at IS NULL AND o.parked_at IS NULL
      AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())
      AND (o.seq = 0 OR NOT EXISTS (
          SELECT 1 FROM `+m+` p
          WHERE p.part = o.part AND p.sink = o.sink AND p.key = o.key AND p.seq < o.seq
            AND p.published_at IS NULL
            AND (p.parked_at IS NOT NULL OR p.next_attempt_at > now())))
    ORDER BY o.sink, o.key, o.seq
    LIMIT $3) o
ORDER BY o.part, o.sink, o.key, o.seq
LIMIT $2`, parts, limit, perPart)
	if err != nil {
		return nil, fmt.Errorf("outbox: fetch: %w", err)
	}
	defer rows.Close()
	var out []row
	for rows.Next() {
		var x row
		var headers []byte
		if err := rows.Scan(&x.id, &x.part, &x.msg.Sink, &x.msg.Key, &x.seq, &x.msg.ID, &x.msg.Value, &headers, &x.attempts, &x.created); err != nil {
			return nil, fmt.Errorf("outbox: fetch: %w", err)
		}
		if x.msg.Headers, err = decodeHeaders(headers); err != nil {
			return nil, fmt.Errorf("outbox: fetch row %d: %w", x.id, err)
		}
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: fetch: %w", err)
	}
	return out, nil
}

// Outcomes a relay writes back for a row.
const (
	outPublished = 0
	outRetry     = 1
	outPark      = 2
)

// outcome is what became of one row.
type outcome struct {
	id    int64
	kind  int32
	err   string
	delay time.Duration
}

// settle writes the outcomes in one statement, fenced: only rows of
// partitions this relay still holds with the generation it read them
// under are changed. It returns how many were.
func (r *Relay) settle(ctx context.Context, outs []outcome, parts []int32, gens []int64) (int64, error) {
	if len(outs) == 0 {
		return 0, nil
	}
	ids := make([]int64, len(outs))
	kinds := make([]int32, len(outs))
	errs := make([]string, len(outs))
	delays := make([]int64, len(outs))
	for i, o := range outs {
		ids[i], kinds[i], errs[i], delays[i] = o.id, o.kind, o.err, o.delay.Milliseconds()
	}
	tag, err := r.db.Exec(ctx, `UPDATE `+r.t.messages+` o SET
    published_at    = CASE WHEN x.kind = 0 THEN now() END,
    attempts        = o.attempts + CASE WHEN x.kind = 0 THEN 0 ELSE 1 END,
    last_error      = CASE WHEN x.kind = 0 THEN o.last_error ELSE x.err END,
    next_attempt_at = CASE WHEN x.kind = 1 THEN now() + x.delay_ms * interval '1 millisecond' END,
    parked_at       = CASE WHEN x.kind = 2 THEN now() END,
    park_reason     = CASE WHEN x.kind = 2 THEN x.err END
FROM unnest($1::bigint[], $2::int[], $3::text[], $4::bigint[]) AS x(id, kind, err, delay_ms)
WHERE o.id = x.id AND o.published_at IS NULL AND o.parked_at IS NULL
  AND o.part = ANY (ARRAY(
      SELECT l.part FROM `+r.t.leases+` l JOIN unnest($5::int[], $6::bigint[]) AS h(part, gen)
          ON l.part = h.part AND l.generation = h.gen
      WHERE l.owner = $7))`, ids, kinds, errs, delays, parts, gens, r.owner)
	if err != nil {
		return 0, fmt.Errorf("outbox: settle: %w", err)
	}
	return tag.RowsAffected(), nil
}

// cleanup deletes rows of parts published longer than the retention ago,
// in batches of at most CleanupBatch rows, and returns how many it deleted.
func (r *Relay) cleanup(ctx context.Context, parts []int32) (int64, error) {
	var total int64
	for {
		tag, err := r.db.Exec(ctx, `DELETE FROM `+r.t.messages+` WHERE id IN (
    SELECT id FROM `+r.t.messages+`
    WHERE part = ANY($1) AND published_at < now() - $2::interval
    LIMIT $3)`, parts, r.cfg.Retention, r.cfg.CleanupBatch)
		if err != nil {
			return total, fmt.Errorf("outbox: cleanup: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(r.cfg.CleanupBatch) || ctx.Err() != nil {
			return total, nil
		}
	}
}

// backlog reads, per sink, how many rows wait for a relay (unpublished and
// not parked) and the age of the oldest.
func (r *Relay) backlog(ctx context.Context) ([]Backlog, error) {
	rows, err := r.db.Query(ctx, `SELECT sink, count(*), extract(epoch FROM now() - min(created_at))::float8
FROM `+r.t.messages+`
WHERE published_at IS NULL AND parked_at IS NULL
GROUP BY sink ORDER BY sink`)
	if err != nil {
		return nil, fmt.Errorf("outbox: backlog: %w", err)
	}
	defer rows.Close()
	var out []Backlog
	for rows.Next() {
		var b Backlog
		var secs float64
		if err := rows.Scan(&b.Sink, &b.Waiting, &secs); err != nil {
			return nil, fmt.Errorf("outbox: backlog: %w", err)
		}
		b.Oldest = time.Duration(max(secs, 0) * float64(time.Second))
		out = append(out, b)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: backlog: %w", err)
	}
	return out, nil
}
