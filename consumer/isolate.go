package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
)

// Isolating a batch: when handlers keep failing (or the COMMIT was
// refused), the batch runs again under savepoints, so each failing message
// is found and rolled back alone while the rest commits.

// isolation is the state of one isolating pass over a batch.
type isolation struct {
	tx pgx.Tx
	st *BatchStats
	// held is, per sender, the lowest sequence number of the batch to be
	// retried: the sender's later messages wait for it.
	held map[senderRef]int64
	// check runs the deferred constraints after each message (or group),
	// to find the one that makes the COMMIT fail.
	check bool
}

// runIsolated settles the batch under savepoints so that each failing
// message is found and rolled back alone: message by message for a
// Handler, by bisection for a BatchHandler. With check, the deferred
// constraints are checked after each handler call too.
func (c *Consumer) runIsolated(ctx context.Context, b *Batch, items []*item, st *BatchStats, check bool) error {
	tx, err := c.begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	todo, held := c.prepare(items)
	p := &isolation{tx: tx, st: st, held: held, check: check}
	if c.cfg.BatchHandler != nil {
		if err := c.bisect(ctx, p, todo); err != nil {
			return err
		}
	} else {
		for _, it := range todo {
			if err := c.isolateOne(ctx, p, it); err != nil {
				return err
			}
		}
	}
	return c.commit(ctx, tx, b, items, st)
}

// handle runs the handler for news under the isolation's savepoint and,
// with p.check, the deferred constraints after it. A lost connection is
// returned as lost; any other failure as herr.
func (c *Consumer) handle(ctx context.Context, p *isolation, news []*item) (herr, lost error) {
	t := time.Now()
	if c.cfg.BatchHandler != nil {
		herr = c.callBatch(ctx, p.tx, news)
	} else {
		herr = c.call(ctx, p.tx, news[0].m)
	}
	if herr == nil && p.check {
		herr = checkDeferred(ctx, p.tx)
	}
	p.st.Handle += time.Since(t)
	if herr != nil {
		lost = connLost(p.tx, herr, time.Since(t), c.cfg.IdleTxTimeout)
	}
	return herr, lost
}

// isolateOne claims and handles one message under a savepoint.
func (c *Consumer) isolateOne(ctx context.Context, p *isolation, it *item) error {
	tx, st, held := p.tx, p.st, p.held
	if c.sequenced && it.key.Sender != "" && mustWait(it, held) {
		c.wait(it, "an earlier message of its sender is waiting for a retry")
		return nil
	}
	if _, err := tx.Exec(ctx, "SAVEPOINT effectively_msg"); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	news, err := c.claim(ctx, tx, []*item{it}, st)
	var ke *dedupe.KeyError
	if errors.As(err, &ke) {
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT effectively_msg"); err != nil {
			return fmt.Errorf("rollback to savepoint: %w", err)
		}
		it.reset()
		it.keyErr = ke
		it.park(ReasonInvalidKey, ke, false)
	} else if err != nil {
		return err
	}
	if len(news) == 1 {
		if it.failed != nil {
			c.parkFailed(it)
		} else {
			herr, lost := c.handle(ctx, p, news)
			if lost != nil {
				return lost
			}
			if herr == nil {
				it.outcome = OutcomeApplied
			} else {
				if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT effectively_msg"); err != nil {
					return fmt.Errorf("rollback to savepoint: %w", err)
				}
				it.reset()
				c.recordFailure(it, herr)
				if it.failedPark {
					// Claim again so the parked row commits with a marker.
					if news, err := c.claim(ctx, tx, []*item{it}, st); err != nil {
						return err
					} else if len(news) == 1 {
						c.parkFailed(it)
					}
				} else {
					it.retry(herr, c.retryDelay(it))
					if c.sequenced {
						hold(held, it)
					}
				}
			}
		}
	}
	if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT effectively_msg"); err != nil {
		return fmt.Errorf("release savepoint: %w", err)
	}
	return nil
}

// bisect claims and handles group under a savepoint; when the batch handler
// fails it rolls the group back and tries each half, down to single
// messages, which are then retried or parked.
func (c *Consumer) bisect(ctx context.Context, p *isolation, group []*item) error {
	tx, st, held := p.tx, p.st, p.held
	if c.sequenced {
		// A message that failed earlier in this pass holds its sender's
		// later ones back.
		ready := group[:0:0]
		for _, it := range group {
			if it.key.Sender != "" && mustWait(it, held) {
				c.wait(it, "an earlier message of its sender is waiting for a retry")
			} else {
				ready = append(ready, it)
			}
		}
		group = ready
	}
	if len(group) == 0 {
		return nil
	}
	if len(group) == 1 {
		return c.isolateOne(ctx, p, group[0])
	}
	if _, err := tx.Exec(ctx, "SAVEPOINT effectively_group"); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	news, err := c.claim(ctx, tx, group, st)
	var herr error
	var ke *dedupe.KeyError
	switch {
	case errors.As(err, &ke):
		herr = ke // split until the refused key is alone
	case err != nil:
		return err
	case len(news) > 0:
		run := news[:0:0]
		for _, it := range news {
			if it.failed != nil {
				c.parkFailed(it) // failed alone before: parked with its marker
			} else {
				run = append(run, it)
			}
		}
		news = run
		if len(run) > 0 {
			var lost error
			if herr, lost = c.handle(ctx, p, run); lost != nil {
				return lost
			}
		}
	}
	if herr == nil {
		for _, it := range news {
			it.outcome = OutcomeApplied
		}
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT effectively_group"); err != nil {
			return fmt.Errorf("release savepoint: %w", err)
		}
		return nil
	}
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT effectively_group; RELEASE SAVEPOINT effectively_group"); err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	for _, it := range group {
		it.reset()
	}
	mid := len(group) / 2
	if err := c.bisect(ctx, p, group[:mid]); err != nil {
		return err
	}
	return c.bisect(ctx, p, group[mid:])
}
