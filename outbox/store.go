package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// parked, not waiting for a retry, not among the in-flight ids (published
// by the pass under way, not yet marked), and with no such parked or
// waiting row before them in their key. They come per key in seq order,
// and each key's rows are a prefix of its publishable ones, so publishing
// them in that order keeps commit order. more reports that a partition
// may hold more than was returned.
//
// The statement's snapshot is the read position: a row whose transaction
// commits later is read by a later fetch, and a transaction still open
// holds back only the keys it emitted to (their counter rows are locked, so
// no later row of those keys can be committed before it).
func (r *Relay) fetch(ctx context.Context, parts []int32, limit int, inflight []int64) (_ []row, more bool, _ error) {
	m := r.t.messages
	// Whether an earlier row of a key is parked or put off is asked row by
	// row only when the partitions hold such a row at all (an InitPlan,
	// evaluated once), which they seldom do.
	//
	// Each partition is read through its own index range, at most perPart
	// rows of it, so a pass costs the rows it may publish, not the whole
	// backlog. The partitions are read from a starting point that turns
	// with every fetch, so that when the rows are cut at limit no
	// partition always comes last. Cutting keeps each key's rows a prefix.
	//
	// The statement is planned on every call (QueryExecModeExec), with its
	// arguments and the table as it is then: a plan cached while the table
	// was empty (a prepared statement's generic plan, after five runs) scans
	// the whole table for every row it returns once a backlog builds, and a
	// fetch takes minutes.
	perPart := r.share(len(parts), limit)
	first := r.turn % len(parts)
	r.turn++
	order := append(slices.Clone(parts[first:]), parts[:first]...)
	rows, err := r.db.Query(ctx, `SELECT o.id, o.part, o.sink, o.key, o.seq, o.msg_id, o.value, o.headers, o.attempts, o.created_at
FROM unnest($1::int[]) WITH ORDINALITY AS q(part, ord), LATERAL (
    SELECT * FROM `+m+` o
    WHERE o.part = q.part AND o.published_at IS NULL AND o.parked_at IS NULL
      AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())
      AND o.id NOT IN (SELECT unnest($3::bigint[]))
      AND (o.seq = 0 OR NOT (SELECT EXISTS (
          SELECT 1 FROM `+m+` b
          WHERE b.part = ANY ($1) AND b.published_at IS NULL
            AND (b.parked_at IS NOT NULL OR b.next_attempt_at IS NOT NULL))) OR NOT EXISTS (
          SELECT 1 FROM `+m+` p
          WHERE p.part = o.part AND p.sink = o.sink AND p.key = o.key AND p.seq < o.seq
            AND p.published_at IS NULL
            AND (p.parked_at IS NOT NULL OR p.next_attempt_at IS NOT NULL)
            AND (p.parked_at IS NOT NULL OR p.next_attempt_at > now())))
    ORDER BY o.sink, o.key, o.seq
    LIMIT $2) o
ORDER BY q.ord, o.sink, o.key, o.seq`, pgx.QueryExecModeExec, order, perPart, inflight)
	if err != nil {
		return nil, false, fmt.Errorf("outbox: fetch: %w", err)
	}
	defer rows.Close()
	var out []row
	perCount := map[int32]int{}
	for rows.Next() {
		var x row
		var headers []byte
		if err := rows.Scan(&x.id, &x.part, &x.msg.Sink, &x.msg.Key, &x.seq, &x.msg.ID, &x.msg.Value, &headers, &x.attempts, &x.created); err != nil {
			return nil, false, fmt.Errorf("outbox: fetch: %w", err)
		}
		if x.msg.Headers, err = decodeHeaders(headers); err != nil {
			return nil, false, fmt.Errorf("outbox: fetch row %d: %w", x.id, err)
		}
		perCount[x.part]++
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("outbox: fetch: %w", err)
	}
	capped := 0
	for _, n := range perCount {
		if n >= perPart {
			capped++
		}
	}
	r.adjustShare(len(parts), limit, len(out), capped)
	if len(out) > limit {
		out, more = out[:limit], true
	}
	return out, more || capped > 0, nil
}

// share is how many rows fetch reads of each partition at most: its even
// share of limit to begin with, more once the work sits in fewer
// partitions (adjustShare).
func (r *Relay) share(parts, limit int) int {
	even := (limit + parts - 1) / max(parts, 1)
	if r.perPart < even {
		r.perPart = even
	}
	return min(r.perPart, limit)
}

// adjustShare doubles the per-partition share when a fetch came back short
// of limit while some partitions had more, and shrinks it back when a
// fetch read much more than limit, so that a backlog in a few partitions
// still fills a batch and an even one is not read several times over.
func (r *Relay) adjustShare(parts, limit, read, capped int) {
	switch {
	case read < limit && capped > 0:
		r.perPart = min(2*r.perPart, limit)
	case read > limit+limit/2:
		r.perPart = max(r.perPart*2/3, (limit+parts-1)/max(parts, 1))
	}
}

// Outcomes a relay writes back for a row.
const (
	outPublished = 0
	outRetry     = 1
	outPark      = 2
)

// outcome is what became of one row.
type outcome struct {
	id       int64
	kind     int32
	err      string
	delay    time.Duration
	redacted *redacted // what a parked row keeps under Redact; nil keeps the row's
}

// settle writes the outcomes in one statement, fenced: only rows of
// partitions this relay still holds with the generation it read them
// under are changed. It returns how many were. Published rows are marked,
// or deleted under DeleteOnPublish; the others are put off or parked.
//
// Each part of the statement finds its rows by primary key (= ANY), and
// the lease check is a filter the planner cannot turn into an index
// condition: as "o.part = ANY (…)" it was matched through the partitions'
// index, a scan of their whole backlog on every pass, and a join of the
// outcomes' unnest with the table turned into a scan of it once the plan
// went generic. It is planned on every call, as fetch is.
//
// The statement commits without waiting for its WAL to reach the disk
// (synchronous_commit off, for this transaction only): a crash of the
// database may forget the last marks written, up to three times
// wal_writer_delay. A message whose mark is lost is published again with
// the same ID, which the next stage drops, and one whose park or retry is
// lost is tried again: at least once either way, as after a relay crash.

func (r *Relay) settle(ctx context.Context, outs []outcome, parts []int32, gens []int64) (int64, error) {
	if len(outs) == 0 {
		return 0, nil
	}
	var pub, fail []int64
	var kinds []int32
	var errs []string
	var delays []int64
	var red []bool // under Redact: which failed rows' value and headers change
	var values, headers [][]byte
	for _, o := range outs {
		if o.kind == outPublished {
			pub = append(pub, o.id)
			continue
		}
		fail, kinds, errs, delays = append(fail, o.id), append(kinds, o.kind), append(errs, o.err), append(delays, o.delay.Milliseconds())
		if o.redacted != nil && red == nil {
			red, values, headers = make([]bool, len(fail)-1), make([][]byte, len(fail)-1), make([][]byte, len(fail)-1)
		}
		if red != nil {
			red = append(red, o.redacted != nil)
			if o.redacted != nil {
				values, headers = append(values, o.redacted.value), append(headers, o.redacted.headers)
			} else {
				values, headers = append(values, nil), append(headers, nil)
			}
		}
	}
	// A park under Redact replaces the row's value and headers in the same
	// statement; without one the statement is the usual.
	setRedacted, unnestRedacted, cols, args := "", "", "x(id, kind, err, delay_ms)", []any{}
	if red != nil {
		setRedacted = `,
        value           = CASE WHEN x.red THEN x.value ELSE o.value END,
        headers         = CASE WHEN x.red THEN x.headers ELSE o.headers END`
		unnestRedacted = `, $9::bool[], $10::bytea[], $11::bytea[]`
		cols = "x(id, kind, err, delay_ms, red, value, headers)"
		args = []any{red, values, headers}
	}
	done := `UPDATE ` + r.t.messages + ` o SET published_at = now(), next_attempt_at = NULL`
	if r.cfg.Retention == DeleteOnPublish {
		done = `DELETE FROM ` + r.t.messages + ` o`
	}
	var n int64
	err := r.db.QueryRow(ctx, `WITH held AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true), ARRAY(
        SELECT l.part FROM `+r.t.leases+` l JOIN unnest($6::int[], $7::bigint[]) AS h(part, gen)
            ON l.part = h.part AND l.generation = h.gen
        WHERE l.owner = $8) AS parts
), published AS (
    `+done+`
    WHERE o.id = ANY ($1::bigint[]) AND o.published_at IS NULL AND o.parked_at IS NULL
      AND array_position((SELECT parts FROM held), o.part) IS NOT NULL
    RETURNING 1
), failed AS (
    UPDATE `+r.t.messages+` o SET
        attempts        = o.attempts + 1,
        last_error      = x.err,
        next_attempt_at = CASE WHEN x.kind = 1 THEN now() + x.delay_ms * interval '1 millisecond' END,
        parked_at       = CASE WHEN x.kind = 2 THEN now() END,
        park_reason     = CASE WHEN x.kind = 2 THEN x.err END`+setRedacted+`
    FROM unnest($2::bigint[], $3::int[], $4::text[], $5::bigint[]`+unnestRedacted+`) AS `+cols+`
    WHERE o.id = x.id AND o.id = ANY ($2) AND o.published_at IS NULL AND o.parked_at IS NULL
      AND array_position((SELECT parts FROM held), o.part) IS NOT NULL
    RETURNING 1
)
SELECT (SELECT count(*) FROM published) + (SELECT count(*) FROM failed)`,
		append([]any{pgx.QueryExecModeExec, pub, fail, kinds, errs, delays, parts, gens, r.owner}, args...)...).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("outbox: settle: %w", err)
	}
	return n, nil
}

// cleanup deletes rows of parts published longer than the retention ago,
// in batches of at most CleanupBatch rows, and returns how many it deleted.
func (r *Relay) cleanup(ctx context.Context, parts []int32) (int64, error) {
	if r.cfg.Retention == DeleteOnPublish {
		return 0, nil
	}
	var total int64
	for {
		tag, err := r.db.Exec(ctx, `DELETE FROM `+r.t.messages+` WHERE id IN (
    SELECT id FROM `+r.t.messages+`
    WHERE part = ANY($1) AND published_at < now() - $2::interval
    LIMIT $3)`, pgx.QueryExecModeExec, parts, r.cfg.Retention, r.cfg.CleanupBatch)
		if err != nil {
			return total, fmt.Errorf("outbox: cleanup: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(r.cfg.CleanupBatch) || ctx.Err() != nil {
			return total, nil
		}
	}
}

// pruneCounters deletes the counter rows of keys with no row waiting (none
// unpublished, none parked), in batches of at most CleanupBatch, and
// returns how many it deleted. A key emitted to again starts a new counter
// at 1: with none of its rows waiting there is no older seq for a new one
// to be ordered against.
//
// It runs in REPEATABLE READ and locks the rows it deletes, skipping those
// an emitter holds: a counter an emitter updated after the statement's
// snapshot (whose new row the snapshot cannot see) fails the lock with a
// serialization error instead of being deleted, and the prune is tried
// again at the next cleanup.
func (r *Relay) pruneCounters(ctx context.Context) (int64, error) {
	var total int64
	for {
		var n int64
		err := pg.BeginInFunc(ctx, r.db, pgx.RepeatableRead, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `DELETE FROM `+r.t.counters+` c USING (
    SELECT c2.sink, c2.key FROM `+r.t.counters+` c2
    WHERE NOT EXISTS (
        SELECT 1 FROM `+r.t.messages+` m
        WHERE m.sink = c2.sink AND m.key = c2.key AND m.published_at IS NULL)
    LIMIT $1
    FOR UPDATE SKIP LOCKED) d
WHERE c.sink = d.sink AND c.key = d.key`, pgx.QueryExecModeExec, r.cfg.CleanupBatch)
			n = tag.RowsAffected()
			return err
		})
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "40001" {
			return total, nil // a counter changed under the prune: next time
		}
		if err != nil {
			return total, fmt.Errorf("outbox: prune counters: %w", err)
		}
		total += n
		if n < int64(r.cfg.CleanupBatch) || ctx.Err() != nil {
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
