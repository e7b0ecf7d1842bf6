package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"
)

// batch is a set of rows on their way through a pass: read, published,
// marked.
type batch struct {
	rows  []row // as read
	parts []int32
	gens  []int64
	more  bool // the fetch left rows behind
	outs  []outcome
	st    *PassStats
	start time.Time
}

func (b *batch) empty() bool { return len(b.rows) == 0 }

// pass publishes one batch and returns how many rows it read and whether
// more may be waiting. The relay works as a pipeline of two batches: while
// one is published (on a goroutine of its own), the one before is marked
// and the next is read, so a pass costs the longer of the publish and the
// database's work, not their sum.
//
// Order holds across the overlap. The next batch is read after the one
// before is marked, so its snapshot sees every row that batch parked or
// put off; it excludes the rows being published; and before it is
// published, every key a row of the batch before it did not publish (a
// failure, a row held behind one, a lease past its deadline) is dropped
// from it. Those rows keep no outcome and are read again behind it.
func (r *Relay) pass(ctx context.Context) (read int, more bool, err error) {
	cur := r.ahead
	r.ahead = batch{}
	if cur.empty() {
		// Nothing read ahead: mark what is published first, so that the
		// read sees it.
		if err := r.mark(ctx); err != nil {
			return 0, false, err
		}
		if cur, err = r.read(ctx, nil); err != nil || cur.empty() {
			return 0, false, err
		}
	}
	if len(r.hooks.pass) > 0 {
		cur.st = &PassStats{Owner: r.owner, Read: len(cur.rows)}
	}
	if r.cfg.beforeCheck != nil {
		r.cfg.beforeCheck()
	}

	type published struct{ outs []outcome }
	done := make(chan published, 1)
	live, deadline := r.live(&cur)
	if len(live) > 0 {
		go func() {
			pctx, cancel := context.WithDeadline(ctx, deadline)
			defer cancel()
			done <- published{r.publishAll(pctx, live, cur.st)}
		}()
	} else {
		done <- published{}
	}

	// Meanwhile: mark the batch before, then read the next one.
	err = r.mark(ctx)
	var next batch
	if err == nil && cur.more && ctx.Err() == nil {
		inflight := make([]int64, len(cur.rows))
		for i, x := range cur.rows {
			inflight[i] = x.id
		}
		next, err = r.read(ctx, inflight)
	}
	cur.outs = (<-done).outs
	if r.cfg.afterPublish != nil && len(live) > 0 {
		if herr := r.cfg.afterPublish(live); herr != nil {
			return 0, false, herr
		}
	}
	r.pipe = cur
	if err != nil {
		return len(cur.rows), false, err
	}
	if next.empty() || ctx.Err() != nil {
		// No batch follows to overlap with: mark this one now.
		return len(cur.rows), cur.more, r.mark(ctx)
	}
	r.ahead = dropFailedKeys(next, cur)
	return len(cur.rows), true, nil
}

// read fetches a batch of the partitions held now.
func (r *Relay) read(ctx context.Context, inflight []int64) (batch, error) {
	parts, gens := r.held()
	if len(parts) == 0 {
		return batch{}, nil
	}
	start := time.Now()
	rows, more, err := r.fetch(ctx, parts, r.cfg.BatchSize, inflight)
	return batch{rows: rows, parts: parts, gens: gens, more: more, start: start}, err
}

// live returns the rows of b whose lease is still the one they were read
// under and not past its deadline by this relay's clock, and the earliest
// of those deadlines: the publish may not outlast it.
func (r *Relay) live(b *batch) ([]row, time.Time) {
	gens := make(map[int32]int64, len(b.parts))
	for i, p := range b.parts {
		gens[p] = b.gens[i]
	}
	var deadline time.Time
	live := make([]row, 0, len(b.rows))
	for _, x := range b.rows {
		d, ok := r.valid(x.part, gens[x.part])
		if !ok {
			continue
		}
		if deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
		live = append(live, x)
	}
	if b.st != nil {
		b.st.Expired = len(b.rows) - len(live)
	}
	return live, deadline
}

// publishAll publishes rows sink by sink and returns their outcomes.
func (r *Relay) publishAll(ctx context.Context, rows []row, st *PassStats) []outcome {
	var outs []outcome
	bySink := map[string][]row{}
	var order []string
	for _, x := range rows {
		if _, ok := bySink[x.msg.Sink]; !ok {
			order = append(order, x.msg.Sink)
		}
		bySink[x.msg.Sink] = append(bySink[x.msg.Sink], x)
	}
	for _, name := range order {
		t0 := time.Now()
		o := r.publish(ctx, name, bySink[name])
		if st != nil {
			st.Sinks = append(st.Sinks, r.sinkPass(name, bySink[name], o, time.Since(t0)))
		}
		outs = append(outs, o...)
	}
	return outs
}

// mark writes back the outcomes of the batch published and not yet
// marked, and reports its pass to the hooks. It marks even when ctx is
// done: what was published should not be again.
func (r *Relay) mark(ctx context.Context) (err error) {
	b := r.pipe
	if b.empty() {
		return nil
	}
	r.pipe = batch{}
	if b.st != nil {
		defer func() {
			b.st.Err, b.st.Total = err, time.Since(b.start)
			r.passDone(ctx, b.st)
		}()
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseTTL)
	defer cancel()
	n, err := r.settle(sctx, b.outs, b.parts, b.gens)
	if err != nil {
		// The broker acknowledged what was published; only the record of
		// it failed, or its COMMIT lost its reply and may have landed.
		// Either way nothing is lost: rows not marked are published again
		// with the same IDs, which the next stage drops as duplicates.
		r.log.Warn("outbox: marking a pass's outcomes failed (or its commit's reply was lost): the rows it published were acknowledged by the broker, and those not marked will be published again with the same IDs, which the next stage drops as duplicates",
			"owner", r.owner, "rows", len(b.outs), "err", err)
		return err
	}
	if b.st != nil {
		b.st.Marked = n
	}
	if n < int64(len(b.outs)) {
		r.log.Warn("outbox: lease lost before marking; another relay publishes these again",
			"owner", r.owner, "rows", len(b.outs), "marked", n)
	}
	return nil
}

// dropFailedKeys removes from next the rows of every key that had a row in
// prev without a published outcome, so that none of them overtakes it.
func dropFailedKeys(next, prev batch) batch {
	published := make(map[int64]bool, len(prev.outs))
	for _, o := range prev.outs {
		if o.kind == outPublished {
			published[o.id] = true
		}
	}
	failed := map[string]bool{}
	for _, x := range prev.rows {
		if x.msg.Key != nil && !published[x.id] {
			failed[x.msg.Sink+"\x00"+string(x.msg.Key)] = true
		}
	}
	if len(failed) == 0 {
		return next
	}
	kept := next.rows[:0]
	for _, x := range next.rows {
		if x.msg.Key == nil || !failed[x.msg.Sink+"\x00"+string(x.msg.Key)] {
			kept = append(kept, x)
		}
	}
	next.rows = kept
	next.more = true
	return next
}

// sinkPass counts what became of one sink's rows in a pass and, for the
// published ones, their commit-to-publish latency.
func (r *Relay) sinkPass(name string, rows []row, outs []outcome, took time.Duration) SinkPass {
	sp := SinkPass{Sink: name, Publish: took, Held: len(rows) - len(outs)}
	now := r.now()
	created := make(map[int64]time.Time, len(rows))
	for _, x := range rows {
		created[x.id] = x.created
	}
	for _, o := range outs {
		switch o.kind {
		case outPublished:
			sp.Published++
			sp.CommitToPublish = append(sp.CommitToPublish, max(now.Sub(created[o.id]), 0))
		case outRetry:
			sp.Retried++
		case outPark:
			sp.Parked++
		}
	}
	return sp
}

// publish sends one sink's rows and returns their outcomes. Once a row of
// a key fails, the key's later rows of the batch get no outcome (they stay
// as they were and come back, after the failed one, in a later pass), even
// if the sink published them: that is a duplicate, never a reordering of
// what is marked.
func (r *Relay) publish(ctx context.Context, name string, rows []row) []outcome {
	sink := r.cfg.Sinks[name]
	if sink == nil {
		reason := fmt.Sprintf("outbox: no sink named %q in RelayConfig.Sinks", name)
		return r.outcomes(ctx, rows, func(int) error { return Permanent(errors.New(reason)) })
	}
	// A keyed row without a seq was emitted in LogMode, with no counter
	// to order it among its key's rows: parked, never published out of
	// order. Its key's later rows stay behind it.
	var unordered map[int]bool
	msgs := make([]Message, 0, len(rows))
	at := make([]int, len(rows)) // rows[i] is msgs[at[i]]
	for i := range rows {
		if !r.byCommit && rows[i].msg.Key != nil && rows[i].seq == 0 {
			if unordered == nil {
				unordered = map[int]bool{}
				r.log.Error("outbox: keyed messages emitted by an Outbox in LogMode, which the table-polling Relay cannot keep in key order: parked; "+
					"set Config.Mode = TableMode on every Outbox that emits to this table, or read it with a LogRelay (which also publishes parked rows once redriven)",
					"sink", name, "id", rows[i].msg.ID)
			}
			unordered[i] = true
			continue
		}
		at[i] = len(msgs)
		msgs = append(msgs, rows[i].msg)
	}
	errs := make([]error, len(msgs))
	if len(msgs) > 0 {
		spread(errs, sink.Publish(ctx, msgs))
	}
	if len(msgs) > 1 {
		r.isolate(ctx, sink, msgs, errs)
	}
	return r.outcomes(ctx, rows, func(i int) error {
		if unordered[i] {
			return Permanent(ErrUnordered)
		}
		return errs[at[i]]
	})
}

// ErrUnordered is the reason the table-polling Relay parks a keyed message
// emitted by an Outbox in LogMode: without TableMode's per-key counter,
// nothing orders it among its key's messages by commit.
var ErrUnordered = errors.New("outbox: keyed message emitted in LogMode, without the per-key counter the table-polling Relay orders by (Config.Mode = TableMode)")

// spread sets errs from what Publish returned.
func spread(errs []error, err error) {
	var pe PublishErrors
	switch {
	case err == nil:
	case errors.As(err, &pe):
		for i := range errs {
			errs[i] = pe[i]
		}
	default:
		for i := range errs {
			errs[i] = err
		}
	}
}

// isolate publishes again, one at a time, the messages of a batch that
// failed for good: a broker may refuse a whole request for one message
// (kafka-go fails a partition's batch with Message Size Too Large), and only
// the message refused on its own is parked. A key whose message fails alone
// is not tried further, so its order holds.
func (r *Relay) isolate(ctx context.Context, sink Sink, msgs []Message, errs []error) {
	any := false
	for _, err := range errs {
		any = any || IsPermanent(err)
	}
	if !any {
		return
	}
	held := map[string]bool{}
	for i, m := range msgs {
		k := string(m.Key)
		if m.Key != nil && held[k] {
			if errs[i] != nil && IsPermanent(errs[i]) {
				errs[i] = errors.New("outbox: behind a failure of its key")
			}
			continue
		}
		if IsPermanent(errs[i]) {
			one := []error{nil}
			spread(one, sink.Publish(ctx, msgs[i:i+1]))
			errs[i] = one[0]
		}
		if errs[i] != nil && m.Key != nil {
			held[k] = true
		}
	}
}

func (r *Relay) outcomes(ctx context.Context, rows []row, errOf func(int) error) []outcome {
	var outs []outcome
	var failedSink string
	var failedKey []byte
	failed := false
	for i, x := range rows {
		if failed && x.msg.Key != nil && x.msg.Sink == failedSink && bytes.Equal(x.msg.Key, failedKey) {
			continue // held back behind the failure
		}
		err := errOf(i)
		switch {
		case err == nil:
			outs = append(outs, outcome{id: x.id, kind: outPublished})
			continue
		case IsPermanent(err):
			o := outcome{id: x.id, kind: outPark, err: err.Error()}
			if r.cfg.Redact != nil {
				red, rerr := redactParked(r.cfg.Redact, x.msg)
				if rerr != nil {
					d := backoff(r.cfg.MinBackoff, r.cfg.MaxBackoff, x.attempts+1)
					r.log.Error("outbox: message refused for good, but Redact failed on it: not parked, tried again (fix Redact)",
						"sink", x.msg.Sink, "id", x.msg.ID, "in", d, "err", err, "redact_err", rerr)
					outs = append(outs, outcome{id: x.id, kind: outRetry, err: rerr.Error(), delay: d})
					break
				}
				o.redacted = red
			}
			r.log.Warn("outbox: message refused for good, parked", "sink", x.msg.Sink, "id", x.msg.ID, "redacted", o.redacted != nil, "err", err)
			outs = append(outs, o)
		case ctx.Err() != nil:
			// Shutting down or past the lease: not the message's fault.
		default:
			d := backoff(r.cfg.MinBackoff, r.cfg.MaxBackoff, x.attempts+1)
			r.log.Debug("outbox: publish failed, retrying", "sink", x.msg.Sink, "id", x.msg.ID, "in", d, "err", err)
			outs = append(outs, outcome{id: x.id, kind: outRetry, err: err.Error(), delay: d})
		}
		if x.msg.Key != nil {
			failed, failedSink, failedKey = true, x.msg.Sink, x.msg.Key
		}
	}
	return outs
}
