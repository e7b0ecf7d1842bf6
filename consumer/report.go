package consumer

import (
	"context"
	"log/slog"
)

// beginBatch numbers a batch, builds the BatchStats that the batch's stages
// fill in, and runs the start hooks. The context it returns carries what
// the hooks added (a trace span, say) and is the batch's context from here
// on.
func (c *Consumer) beginBatch(ctx context.Context, b *Batch) (context.Context, *BatchStats) {
	st := &BatchStats{BatchInfo: BatchInfo{
		Consumer: c.cfg.Name,
		Strategy: c.cfg.Strategy.Name(),
		Lane:     b.Lane,
		Batch:    c.batches.Add(1),
		Size:     len(b.Messages),
	}}
	for _, h := range c.startHooks {
		ctx = h.BatchStart(ctx, st.BatchInfo)
	}
	return ctx, st
}

// report counts outcomes, logs the noteworthy ones and calls the hooks.
func (c *Consumer) report(ctx context.Context, st *BatchStats, items []*item) {
	for _, it := range items {
		switch it.outcome {
		case OutcomeApplied:
			st.Applied++
		case OutcomeDuplicate:
			st.Duplicate++
		case OutcomeMismatch:
			st.Mismatch++
			c.log.WarnContext(ctx, "key reused with another payload; treated as a duplicate",
				"key", it.key.String(), "ref", it.m.Ref, "lane", it.m.Lane, "batch", st.Batch)
		case OutcomeParked:
			st.Parked++
			c.log.WarnContext(ctx, "message parked", "reason", it.reason, "ref", it.m.Ref, "lane", it.m.Lane,
				"batch", st.Batch, "attempt", it.attempt(), "err", errString(it.err))
		case OutcomeUnknown:
			st.Unknown++
		case OutcomeRetried:
			st.Retried++
			if it.waiting {
				st.Gap++
			}
			if c.log.Enabled(ctx, slog.LevelDebug) {
				c.log.DebugContext(ctx, "message will be retried", "ref", it.m.Ref, "lane", it.m.Lane,
					"batch", st.Batch, "attempt", it.attempt(), "delay", it.delay, "err", errString(it.err))
			}
		}
	}
	for _, h := range c.cfg.Hooks {
		h.BatchDone(ctx, st)
	}
	if len(c.msgHooks) > 0 {
		e := MessageEvent{BatchInfo: st.BatchInfo}
		for _, it := range items {
			if it.outcome == 0 {
				continue // abandoned with its batch
			}
			e.Message, e.Outcome, e.Err = it.m, it.outcome, it.err
			if it.outcome == OutcomeParked {
				e.Err = &ParkedError{Reason: it.reason, Err: it.err}
			}
			for _, h := range c.msgHooks {
				h.MessageDone(ctx, e)
			}
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
