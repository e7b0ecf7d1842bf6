package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// publishLoop publishes the transactions the stream hands over, several
// at a time (up to BatchSize messages, whatever has arrived), in commit
// order, and confirms each batch's last transaction once everything up to
// it was published or parked. Every PollInterval it publishes what was
// redriven. It returns when ctx is done, after the batch in progress.
func (r *LogRelay) publishLoop(ctx context.Context, txns <-chan *logTxn, pending *atomic.Int64) error {
	if err := r.reconcile(ctx); err != nil && ctx.Err() == nil {
		r.log.Warn("outbox: log relay: redriven messages", "err", err)
	}
	poll := time.NewTicker(r.cfg.PollInterval)
	defer poll.Stop()
	for {
		var batch []*logTxn
		select {
		case <-ctx.Done():
			return nil
		case <-poll.C:
			if err := r.reconcile(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("outbox: log relay: redriven messages", "err", err)
			}
			continue
		case t := <-txns:
			batch = append(batch, t)
		}
		n := len(batch[0].rows)
	more:
		for n < r.cfg.BatchSize {
			select {
			case t := <-txns:
				batch = append(batch, t)
				n += len(t.rows)
			default:
				break more
			}
		}
		rows := make([]row, 0, n)
		for _, t := range batch {
			rows = append(rows, t.rows...)
		}
		if _, err := r.publishRows(ctx, rows); err != nil {
			if errors.Is(err, errCrash) {
				return err
			}
			return nil // ctx is done: not confirmed, read again by the next reader
		}
		r.advance(batch[len(batch)-1].end)
		pending.Add(-int64(len(batch)))
	}
}

// publishRows publishes rows, in order, BatchSize at a time, and returns
// the IDs of the rows published. It returns only when every row is
// published or parked, or with an error when ctx is done first.
func (r *LogRelay) publishRows(ctx context.Context, rows []row) ([]int64, error) {
	var published []int64
	for lo := 0; lo < len(rows); lo += r.cfg.BatchSize {
		p, err := r.publishChunk(ctx, rows[lo:min(lo+r.cfg.BatchSize, len(rows))])
		published = append(published, p...)
		if err != nil {
			return published, err
		}
	}
	return published, nil
}

// publishChunk publishes one chunk until each row is published or parked.
// A row refused for good is parked with the reason, and its key's later
// rows are parked behind it (held, as with Relay, until a redrive); a row
// failed transiently is tried again after a backoff, with its key's later
// rows, which a Sink does not publish past a failure of their key. The
// publish in progress is finished when ctx is done; no retry follows.
func (r *LogRelay) publishChunk(ctx context.Context, rows []row) ([]int64, error) {
	var published []int64
	start := time.Now()
	for attempt := 1; ; attempt++ {
		var err error
		if rows, err = r.parkHeld(ctx, rows); err != nil {
			return published, err
		}
		if len(rows) == 0 {
			return published, nil
		}
		var st *PassStats
		if len(r.hooks.pass) > 0 {
			st = &PassStats{Owner: r.cfg.Owner, Read: len(rows)}
		}
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*r.cfg.MaxBackoff+time.Minute)
		outs := r.pub.publishAll(pctx, rows, st)
		cancel()
		if r.cfg.afterPublish != nil {
			if err := r.cfg.afterPublish(rows); err != nil {
				return published, err
			}
		}
		byID := make(map[int64]outcome, len(outs))
		for _, o := range outs {
			byID[o.id] = o
		}
		var rest, park []row
		var reasons []string
		var wait time.Duration
		for i, x := range rows {
			o, ok := byID[x.id]
			switch {
			case ok && o.kind == outPublished:
				published = append(published, x.id)
			case ok && o.kind == outPark:
				park = append(park, x)
				reasons = append(reasons, o.err)
			default:
				if ok && o.kind == outRetry {
					wait = max(wait, o.delay)
				}
				rows[i].attempts++
				rest = append(rest, rows[i])
			}
		}
		if err := r.park(ctx, park, reasons); err != nil {
			return published, err
		}
		if st != nil {
			st.Total = time.Since(start)
			for _, h := range r.hooks.pass {
				h.PassDone(ctx, st)
			}
		}
		r.count(func(s *LogStats) { s.Published += int64(len(rows) - len(rest) - len(park)) })
		if len(rest) == 0 {
			return published, nil
		}
		rows = rest
		if wait == 0 {
			wait = backoff(r.cfg.MinBackoff, r.cfg.MaxBackoff, attempt)
		}
		select {
		case <-ctx.Done():
			return published, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// heldKey is a key's entry in the held set; keyless messages hold nothing.
func heldKey(m *Message) string { return m.Sink + "\x00" + string(m.Key) }

// parkHeld parks the rows of held keys, behind their key's parked row,
// and returns the others.
func (r *LogRelay) parkHeld(ctx context.Context, rows []row) ([]row, error) {
	if len(r.held) == 0 {
		return rows, nil
	}
	var keep, park []row
	var reasons []string
	for _, x := range rows {
		if x.msg.Key != nil && r.held[heldKey(&x.msg)] {
			park = append(park, x)
			reasons = append(reasons, "outbox: behind a parked message of its key")
			continue
		}
		keep = append(keep, x)
	}
	return keep, r.park(ctx, park, reasons)
}

// park writes the parked rows, with their reasons, in one transaction,
// trying again until it succeeds or ctx is done, and holds their keys.
// (The refusals were logged as they were classified.) A messages-table
// row is marked parked; a message of the log table is written to the
// messages table as a parked row (the log table keeps no state, and its
// half is truncated once confirmed), unless a parked row of it is there
// already (the stream delivers again what a relay parked and had not
// confirmed when it stopped). last_error is set with park_reason
// and kept by a redrive, which is how the relay finds redriven rows again
// (reconcile).
func (r *LogRelay) park(ctx context.Context, rows []row, reasons []string) error {
	if len(rows) == 0 {
		return nil
	}
	for _, x := range rows {
		if x.msg.Key != nil {
			r.held[heldKey(&x.msg)] = true
		}
	}
	for attempt := 1; ; attempt++ {
		err := r.parkOnce(ctx, rows, reasons)
		if err == nil {
			r.count(func(s *LogStats) { s.Parked += int64(len(rows)) })
			return nil
		}
		r.log.Warn("outbox: log relay: cannot park; trying again", "rows", len(rows), "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff(r.cfg.MinBackoff, r.cfg.MaxBackoff, attempt)):
		}
	}
}

// parkOnce parks rows, each keeping what Redact makes of its message when
// Redact is set; nothing is parked when Redact fails on one of them.
func (r *LogRelay) parkOnce(ctx context.Context, rows []row, reasons []string) error {
	var upd, ins struct {
		ids, attempts   []int64
		parts           []int32
		sinks, msgIDs   []string
		reasons         []string
		keys            [][]byte
		values, headers [][]byte
		created         []time.Time
	}
	for i, x := range rows {
		value, headers := x.msg.Value, encodeHeaders(x.msg.Headers)
		if r.cfg.Redact != nil {
			red, err := redactParked(r.cfg.Redact, x.msg)
			if err != nil {
				r.log.Error("outbox: log relay: Redact failed on a message to park; nothing parked, trying again (fix Redact)", "sink", x.msg.Sink, "id", x.msg.ID, "err", err)
				return err
			}
			value, headers = red.value, red.headers
		}
		to := &upd
		if x.id < 0 {
			to = &ins
		}
		to.ids = append(to.ids, x.id)
		to.attempts = append(to.attempts, int64(x.attempts)+1)
		to.parts = append(to.parts, x.part)
		to.sinks = append(to.sinks, x.msg.Sink)
		to.msgIDs = append(to.msgIDs, x.msg.ID)
		to.reasons = append(to.reasons, reasons[i])
		to.keys = append(to.keys, x.msg.Key)
		to.values = append(to.values, value)
		to.headers = append(to.headers, headers)
		to.created = append(to.created, x.created)
	}
	return pgx.BeginFunc(ctx, r.pool, func(tx pgx.Tx) error {
		if len(upd.ids) > 0 {
			set := ``
			if r.cfg.Redact != nil {
				set = `, value = x.value, headers = x.headers`
			}
			if _, err := tx.Exec(ctx, `UPDATE `+r.t.messages+` o
SET parked_at = now(), park_reason = x.reason, last_error = x.reason, attempts = o.attempts + 1`+set+`
FROM unnest($1::bigint[], $2::text[], $3::bytea[], $4::bytea[]) AS x(id, reason, value, headers)
WHERE o.id = x.id AND o.published_at IS NULL`, upd.ids, upd.reasons, upd.values, upd.headers); err != nil {
				return err
			}
		}
		if len(ins.ids) > 0 {
			if _, err := tx.Exec(ctx, `INSERT INTO `+r.t.messages+`
    (part, sink, key, seq, msg_id, value, headers, created_at, attempts, parked_at, park_reason, last_error)
SELECT part, sink, key, 0, msg_id, value, headers, created, attempts, now(), reason, reason
FROM unnest($1::int[], $2::text[], $3::bytea[], $4::text[], $5::bytea[], $6::bytea[], $7::timestamptz[], $8::bigint[], $9::text[])
    WITH ORDINALITY AS x(part, sink, key, msg_id, value, headers, created, attempts, reason, ord)
WHERE NOT EXISTS (
    SELECT 1 FROM `+r.t.messages+` m
    WHERE m.published_at IS NULL AND m.last_error IS NOT NULL AND m.sink = x.sink
      AND (m.key = x.key OR m.key IS NULL AND x.key IS NULL) AND m.msg_id = x.msg_id)
ORDER BY ord`, ins.parts, ins.sinks, ins.keys, ins.msgIDs, ins.values, ins.headers, ins.created, ins.attempts, ins.reasons); err != nil {
				return err
			}
		}
		return nil
	})
}

// reconcile reads the rows the stream will not deliver again: parked, or
// parked and then redriven (Outbox.Redrive clears parked_at and keeps
// last_error), and not published. It publishes, per key in seq order
// (TableMode rows before LogMode rows, as recoverFrom), the redriven rows
// up to the key's first row still parked, marks them published, and holds
// the keys that still have a parked row.
func (r *LogRelay) reconcile(ctx context.Context) error {
	rs, err := r.pool.Query(ctx, `SELECT id, part, sink, key, seq, msg_id, value, headers, created_at, attempts, parked_at IS NOT NULL
FROM `+r.t.messages+`
WHERE published_at IS NULL AND last_error IS NOT NULL
ORDER BY sink, key, seq = 0, seq, id`)
	if err != nil {
		return fmt.Errorf("outbox: log relay: %w", err)
	}
	var ready []row
	held := map[string]bool{}
	for rs.Next() {
		var x row
		var headers []byte
		var parked bool
		if err := rs.Scan(&x.id, &x.part, &x.msg.Sink, &x.msg.Key, &x.seq, &x.msg.ID, &x.msg.Value, &headers,
			&x.created, &x.attempts, &parked); err != nil {
			rs.Close()
			return fmt.Errorf("outbox: log relay: %w", err)
		}
		if x.msg.Headers, err = decodeHeaders(headers); err != nil {
			rs.Close()
			return fmt.Errorf("outbox: log relay: row %d: %w", x.id, err)
		}
		switch {
		case parked && x.msg.Key != nil:
			held[heldKey(&x.msg)] = true
		case parked:
		case x.msg.Key != nil && held[heldKey(&x.msg)]:
			// behind a row of its key still parked
		default:
			ready = append(ready, x)
		}
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return fmt.Errorf("outbox: log relay: %w", err)
	}
	r.held = held
	if len(ready) == 0 {
		return nil
	}
	published, err := r.publishRows(ctx, ready)
	if len(published) > 0 {
		_, merr := r.pool.Exec(ctx, `UPDATE `+r.t.messages+` SET published_at = now() WHERE id = ANY($1) AND published_at IS NULL`,
			pgx.QueryExecModeExec, published)
		if merr != nil && err == nil {
			err = fmt.Errorf("outbox: log relay: mark redriven messages published: %w", merr)
		}
	}
	return err
}
