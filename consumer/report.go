package consumer

import (
	"context"
	"log/slog"
)

// beginBatch builds the stats of batch b and runs the start hooks.
func (c *Consumer) beginBatch(ctx context.Context, b *Batch) (context.Context, *BatchStats) {
	for _, h := range c.startHooks {
		ctx = h.BatchStart(ctx, c.cfg.Name, b.Lane, len(b.Messages))
	}
	return ctx, &BatchStats{Consumer: c.cfg.Name, Strategy: c.cfg.Strategy.Name(), Lane: b.Lane, Size: len(b.Messages)}
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
			c.log.Warn("key reused with another payload; treated as a duplicate",
				"key", it.key.String(), "ref", it.m.Ref, "lane", it.m.Lane)
		case OutcomeParked:
			st.Parked++
			c.log.Warn("message parked", "reason", it.reason, "ref", it.m.Ref, "lane", it.m.Lane,
				"attempt", it.attempt(), "err", errString(it.err))
		case OutcomeUnknown:
			st.Unknown++
		case OutcomeRetried:
			st.Retried++
			if it.waiting {
				st.Gap++
			}
			if c.log.Enabled(ctx, slog.LevelDebug) {
				c.log.Debug("message will be retried", "ref", it.m.Ref, "lane", it.m.Lane,
					"attempt", it.attempt(), "delay", it.delay, "err", errString(it.err))
			}
		}
	}
	for _, h := range c.cfg.Hooks {
		h.BatchDone(ctx, st)
	}
	if len(c.msgHooks) > 0 {
		for _, it := range items {
			if it.outcome == 0 {
				continue // abandoned with its batch
			}
			err := it.err
			if it.outcome == OutcomeParked {
				err = &ParkedError{Reason: it.reason, Err: it.err}
			}
			for _, h := range c.msgHooks {
				h.MessageDone(ctx, it.m, it.outcome, err)
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
