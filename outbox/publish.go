package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"
)

// pass reads one batch of publishable rows of the partitions held, publishes
// them sink by sink and writes back what became of each. It returns how
// many rows it read.
func (r *Relay) pass(ctx context.Context) (_ int, err error) {
	parts, gens := r.held()
	if len(parts) == 0 {
		return 0, nil
	}
	start := time.Now()
	rows, err := r.fetch(ctx, parts, r.cfg.BatchSize)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	var st *PassStats
	if len(r.hooks.pass) > 0 {
		st = &PassStats{Owner: r.owner, Read: len(rows)}
		defer func() {
			st.Err, st.Total = err, time.Since(start)
			r.passDone(ctx, st)
		}()
	}
	if r.cfg.beforeCheck != nil {
		r.cfg.beforeCheck()
	}
	// Only rows whose lease is still good by this relay's clock go out,
	// and the publish may not outlast the earliest of their leases.
	var deadline time.Time
	live := rows[:0:0]
	for _, x := range rows {
		d, ok := r.valid(x.part)
		if !ok {
			continue
		}
		if deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
		live = append(live, x)
	}
	if st != nil {
		st.Expired = len(rows) - len(live)
	}
	if len(live) == 0 {
		return len(rows), nil
	}
	pctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	var outs []outcome
	bySink := map[string][]row{}
	var order []string
	for _, x := range live {
		if _, ok := bySink[x.msg.Sink]; !ok {
			order = append(order, x.msg.Sink)
		}
		bySink[x.msg.Sink] = append(bySink[x.msg.Sink], x)
	}
	for _, name := range order {
		t0 := time.Now()
		o := r.publish(pctx, name, bySink[name])
		if st != nil {
			st.Sinks = append(st.Sinks, r.sinkPass(name, bySink[name], o, time.Since(t0)))
		}
		outs = append(outs, o...)
	}
	if r.cfg.afterPublish != nil {
		if err := r.cfg.afterPublish(live); err != nil {
			return 0, err
		}
	}
	// Mark even when ctx is done: what was published should not be again.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.LeaseTTL)
	defer scancel()
	n, err := r.settle(sctx, outs, parts, gens)
	if err != nil {
		return 0, err
	}
	if st != nil {
		st.Marked = n
	}
	if n < int64(len(outs)) {
		r.log.Warn("outbox: lease lost before marking; another relay publishes these again",
			"owner", r.owner, "rows", len(outs), "marked", n)
	}
	return len(rows), nil
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
	msgs := make([]Message, len(rows))
	for i := range rows {
		msgs[i] = rows[i].msg
	}
	errs := make([]error, len(msgs))
	spread(errs, sink.Publish(ctx, msgs))
	if len(msgs) > 1 {
		r.isolate(ctx, sink, msgs, errs)
	}
	return r.outcomes(ctx, rows, func(i int) error { return errs[i] })
}

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
			r.log.Warn("outbox: message refused for good, parked", "sink", x.msg.Sink, "id", x.msg.ID, "err", err)
			outs = append(outs, outcome{id: x.id, kind: outPark, err: err.Error()})
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
