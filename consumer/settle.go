package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/consumer/standby"
	"github.com/effectively-once/effectively/internal/pgerr"
)

// settle is the stage after the passes: the committed outcomes are
// acknowledged to the source (or the messages handed back for a retry), or,
// when no pass committed (err), the whole batch is handed back; then the
// batch is counted and reported.
func (c *Consumer) settle(ctx context.Context, b *Batch, items []*item, st *BatchStats, err error, start time.Time) error {
	for _, it := range items {
		st.Reruns += max(it.runs-1, 0)
	}
	var ce *commitError
	if errors.As(err, &ce) && ce.kind == commitUnknown {
		err = c.resolveCommit(ctx, b, items, st, ce)
	}
	if err == nil && c.standbys != nil {
		if err = c.awaitStandbys(ctx, b, st); err == nil {
			c.committedItems(items) // in-memory state follows what the standbys hold
		}
	}
	if err != nil {
		return c.abandon(ctx, b, items, st, err, start)
	}
	c.attempts.settled(items)
	if c.sequenced {
		c.senders.settled(items)
	}
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
	standby := errors.Is(err, standby.ErrUnconfirmed) // committed, and may be lost
	unknown := errors.As(err, &ce) && ce.kind == commitUnknown || standby
	for _, it := range items {
		it.reset()
		if unknown {
			it.outcome, it.err = OutcomeUnknown, err
		}
	}
	switch {
	case st.Fenced:
		c.log.InfoContext(ctx, "batch dropped: lane fenced by a newer owner", "lane", b.Lane, "err", err)
	case standby:
		c.log.WarnContext(ctx, "the batch committed, but no standby could confirm its commit: its messages are handed back to the source and delivered again, as duplicates if the commit survived on the server that is now the primary, applied again if it was lost",
			"lane", b.Lane, "size", len(items), "err", err)
	case unknown && c.txsrc != nil:
		c.log.ErrorContext(ctx, "connection lost during commit, and whether the batch committed could not be found out: its messages are handed back to the source and delivered again while this consumer holds the lane, recognised as duplicates if it committed; if the lane moves first (a restart, a rebalance) and it committed, the source's position committed with it and they are not delivered again, their outcome stays unknown here",
			"lane", b.Lane, "size", len(items), "err", err)
	case unknown:
		c.log.ErrorContext(ctx, "connection lost during commit, and whether the batch committed could not be found out: its messages are not acknowledged, so the source delivers them again, and they are recognised as duplicates if it committed",
			"lane", b.Lane, "size", len(items), "err", err)
	case errors.As(err, &ce) && pgerr.IdleTxTimeout(ce.err):
		c.log.WarnContext(ctx, "the server ended the batch's session before its COMMIT ran: the transaction sat idle for longer than IdleTxTimeout "+
			"(this process was stopped or stalled), so nothing committed; its messages will be delivered again, here or by the lane's new owner",
			"lane", b.Lane, "size", len(items), "idle_tx_timeout", c.idleTx, "err", err)
	case errors.Is(err, errCommitNotSent):
		c.log.WarnContext(ctx, "the batch's COMMIT could not be sent, so nothing committed (the server had closed the session: "+
			"after IdleTxTimeout if this process was stopped or stalled); its messages will be delivered again, here or by the lane's new owner",
			"lane", b.Lane, "size", len(items), "idle_tx_timeout", c.idleTx, "err", err)
	case errors.Is(err, errCommitLost):
		c.log.WarnContext(ctx, "connection lost during commit, and the batch did not commit; its messages will be delivered again",
			"lane", b.Lane, "size", len(items), "err", err)
	default:
		c.log.ErrorContext(ctx, "batch rolled back; its messages will be delivered again", "lane", b.Lane, "size", len(items), "err", err)
	}
	if !st.Fenced {
		// Their next delivery is not a failure of theirs.
		c.attempts.abandoned(items)
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

// awaitStandbys holds a committed batch until its commit is on the
// standbys (see standby.Config). It returns nil when the batch is to be
// acknowledged, and an error matching standby.ErrUnconfirmed when it is to
// be handed back.
func (c *Consumer) awaitStandbys(ctx context.Context, b *Batch, st *BatchStats) error {
	t := time.Now()
	r, err := c.standbys.Wait(ctx)
	st.Standby = time.Since(t)
	if err != nil {
		return err
	}
	if r.TimedOut() {
		st.StandbyUnconfirmed = true
		c.log.WarnContext(ctx, fmt.Sprintf("batch acknowledged although %d of the %d standbys required confirmed its commit within StandbyAck.Timeout: should the primary now fail over to a standby that lacks the commit, its effects are lost, and a source that deletes acknowledged messages (SQS) does not deliver them again",
			r.Confirmed, c.cfg.StandbyAck.Standbys), "lane", b.Lane, "size", st.Size, "timeout", c.cfg.StandbyAck.Timeout)
	}
	return nil
}
