package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/jackc/pgx/v5"
)

// handleAll is the fast handle stage: every new message's handler in tx,
// with no savepoint, the happy path's only cost. A failure ends the pass:
// it returns errHandlerFailed with the failure recorded on its message
// (when it can tell which one failed), or the loss of the connection.
// It returns the items whose handler call outlasted IdleTxTimeout.
func (c *Consumer) handleAll(ctx context.Context, tx pgx.Tx, news []*item, st *BatchStats, mode passMode) (slow []*item, err error) {
	t := time.Now()
	defer func() { st.Handle += time.Since(t) }()
	if len(news) == 0 {
		return nil, nil
	}
	idle := c.idleTx
	if c.cfg.QueueHandler != nil {
		return c.handleQueued(ctx, tx, news, !mode.unmerged)
	}
	if c.cfg.BatchHandler != nil {
		if err := c.callBatch(ctx, tx, news); err != nil {
			if lost := connLost(tx, err, time.Since(t), idle); lost != nil {
				return nil, lost
			}
			if len(news) == 1 {
				c.recordFailure(news[0], idleErr(tx, err, time.Since(t), idle))
			}
			return nil, errHandlerFailed
		}
		if idle > 0 && time.Since(t) > idle {
			slow = news
		}
		for _, it := range news {
			it.outcome = OutcomeApplied
		}
		return slow, nil
	}
	for _, it := range news {
		ht := time.Now()
		if err := c.call(ctx, tx, it); err != nil {
			if lost := connLost(tx, err, time.Since(ht), idle); lost != nil {
				return slow, lost // an earlier slow call may have lost it
			}
			c.recordFailure(it, idleErr(tx, err, time.Since(ht), idle))
			return nil, errHandlerFailed
		}
		if idle > 0 && time.Since(ht) > idle {
			slow = append(slow, it)
		}
		it.outcome = OutcomeApplied
	}
	return slow, nil
}

// parkDecided parks, with their markers, the new messages whose failure an
// earlier pass decided to park, and returns the others: their handlers do
// not run again.
func (c *Consumer) parkDecided(news []*item) []*item {
	if !slices.ContainsFunc(news, func(it *item) bool { return it.failed != nil }) {
		return news
	}
	run := news[:0:0]
	for _, it := range news {
		if it.failed != nil {
			c.parkFailed(it)
		} else {
			run = append(run, it)
		}
	}
	return run
}

// recordFailure decides, once per batch, what a handler failure means for
// its message: park it (permanent, or out of attempts) or retry it later.
// A transient database error (classifyHandlerErr) is retried and never
// parks it.
func (c *Consumer) recordFailure(it *item, err error) {
	err = c.classifyHandlerErr(err)
	it.failed = err
	if IsTransient(err) {
		it.failedPark = false
		c.log.Warn("database refused a handler's statement for a reason that passes; the message is retried without counting an attempt",
			"ref", it.m.Ref, "key", it.key.String(), "delivery", it.attempt(), "err", err)
		return
	}
	it.failedPark = IsPermanent(err) || (it.tries >= c.cfg.MaxAttempts && !c.keepRetrying)
	var pe *PanicError
	if errors.As(err, &pe) {
		c.log.Error("handler panicked", "ref", it.m.Ref, "key", it.key.String(), "panic", fmt.Sprint(pe.Value), "stack", string(pe.Stack))
	}
}

func (c *Consumer) parkFailed(it *item) {
	reason := parked.ReasonMaxAttempts
	if IsPermanent(it.failed) {
		reason = parked.ReasonPermanent
	}
	it.park(reason, it.failed, true)
}

// retryDelay is the backoff before a failed message's next delivery: by
// its counted attempts, or, after a transient error, which counts none, by
// its deliveries.
func (c *Consumer) retryDelay(it *item) time.Duration {
	n := it.tries
	if IsTransient(it.failed) {
		n = it.attempt()
	}
	return backoff(c.cfg.RetryBackoff, c.cfg.MaxRetryBackoff, n)
}

// call runs the Handler for one message, turning a panic into a
// *PanicError.
func (c *Consumer) call(ctx context.Context, tx pgx.Tx, it *item) error {
	it.runs++
	return callHandler(ctx, c.cfg.Handler, tx, it.m)
}

// callBatch runs the BatchHandler for items, turning a panic into a
// *PanicError.
func (c *Consumer) callBatch(ctx context.Context, tx pgx.Tx, items []*item) (err error) {
	msgs := make([]*Message, len(items))
	for i, it := range items {
		it.runs++
		msgs[i] = it.m
	}
	return callBatchHandler(ctx, c.cfg.BatchHandler, tx, msgs)
}

func callHandler(ctx context.Context, h Handler, tx pgx.Tx, m *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return h(ctx, tx, m)
}

func callBatchHandler(ctx context.Context, h BatchHandler, tx pgx.Tx, msgs []*Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return h(ctx, tx, msgs)
}

// handleOne runs the handler, any shape, for one message outside a batch
// (Redrive).
func (p *path) handleOne(ctx context.Context, tx pgx.Tx, m *Message) error {
	if p.cfg.QueueHandler != nil {
		q, err := callQueue(ctx, p.cfg.QueueHandler, m)
		if err != nil {
			return err
		}
		_, err = sendQueued(ctx, tx, []*item{{m: m}}, []*msgQueue{q}, nil, false)
		return err
	}
	if p.cfg.BatchHandler != nil {
		return callBatchHandler(ctx, p.cfg.BatchHandler, tx, []*Message{m})
	}
	return callHandler(ctx, p.cfg.Handler, tx, m)
}
