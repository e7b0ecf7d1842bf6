package consumer

import (
	"context"
	"errors"
	"time"
)

// settle is the stage after the passes: the committed outcomes are
// acknowledged to the source (or the messages handed back for a retry), or,
// when no pass committed (err), the whole batch is handed back; then the
// batch is counted and reported.
func (c *Consumer) settle(ctx context.Context, b *Batch, items []*item, st *BatchStats, err error, start time.Time) error {
	for _, it := range items {
		st.Reruns += max(it.runs-1, 0)
	}
	if err != nil {
		return c.abandon(ctx, b, items, st, err, start)
	}
	c.waits.settled(items, c.sequenced)
	ack := make([]*Message, 0, len(items))
	var retry []Retry
	for _, it := range items {
		switch it.outcome {
		case OutcomeRetried:
			retry = append(retry, Retry{Message: it.m, Delay: it.delay})
		default:
			ack = append(ack, it.m)
		}
	}
	t := time.Now()
	if err := c.src.Settle(ctx, b, ack, retry); err != nil {
		// The outcome is committed; the source will deliver these messages
		// again and they will be recognised as duplicates.
		c.log.ErrorContext(ctx, "acknowledging a committed batch failed; its messages may be delivered again", "lane", b.Lane, "err", err)
	}
	st.Ack = time.Since(t)
	st.Total = time.Since(start)
	c.report(ctx, st, items)
	return nil
}

// abandon hands a batch that could not commit back to its source. It
// returns err unless the lane was fenced, which is no failure of this
// consumer.
func (c *Consumer) abandon(ctx context.Context, b *Batch, items []*item, st *BatchStats, err error, start time.Time) error {
	st.Err = err
	st.Fenced = errors.Is(err, ErrFenced)
	var ce *commitError
	unknown := errors.As(err, &ce) && ce.kind == commitUnknown
	for _, it := range items {
		it.reset()
		if unknown {
			it.outcome, it.err = OutcomeUnknown, err
		}
	}
	switch {
	case st.Fenced:
		c.log.InfoContext(ctx, "batch dropped: lane fenced by a newer owner", "lane", b.Lane, "err", err)
	case unknown:
		c.log.WarnContext(ctx, "connection lost during commit: the batch may or may not have committed; its messages will be delivered again and recognised as duplicates if it did",
			"lane", b.Lane, "size", len(items), "err", err)
	default:
		c.log.ErrorContext(ctx, "batch rolled back; its messages will be delivered again", "lane", b.Lane, "size", len(items), "err", err)
	}
	if !st.Fenced {
		// Their next delivery is not a failure of theirs.
		c.waits.abandoned(items)
	}
	if serr := c.src.Settle(ctx, b, nil, nil); serr != nil {
		c.log.ErrorContext(ctx, "settle failed", "lane", b.Lane, "err", serr)
	}
	st.Total = time.Since(start)
	c.report(ctx, st, items)
	if st.Fenced {
		return nil
	}
	return err
}
