package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
)

// The isolated handle stage: when handlers keep failing (or the COMMIT was
// refused), the pass runs under savepoints, so each failing message is
// found and rolled back alone while the rest commits. Claim and handler
// run together under each savepoint, so a failing message's marker rolls
// back with its effect.

// isolation is the state of one isolating pass over a batch.
type isolation struct {
	tx   pgx.Tx
	st   *BatchStats
	gate *gate
	// check runs the deferred constraints after each message (or group),
	// to find the one that makes the COMMIT fail.
	check bool
}

// isolate settles run under savepoints: message by message for a Handler,
// by bisection for a BatchHandler. A message handed back for a retry
// tells the gate, which settles its sender's later messages at once;
// those are skipped here.
func (c *Consumer) isolate(ctx context.Context, p *isolation, run []*item) error {
	if c.cfg.BatchHandler != nil {
		return c.bisect(ctx, p, run)
	}
	for _, it := range run {
		if it.outcome != 0 {
			continue // held back by a failure before it
		}
		if err := c.isolateOne(ctx, p, it); err != nil {
			return err
		}
	}
	return nil
}

// handle runs the handler for news under the isolation's savepoint and,
// with p.check, the deferred constraints after it. A lost connection is
// returned as lost; any other failure as herr.
func (c *Consumer) handle(ctx context.Context, p *isolation, news []*item) (herr, lost error) {
	t := time.Now()
	switch {
	case c.cfg.QueueHandler != nil:
		if herr, lost = c.handleQueuedOne(ctx, p.tx, news[0]); lost != nil {
			return herr, lost
		}
	case c.cfg.BatchHandler != nil:
		herr = c.callBatch(ctx, p.tx, news)
	default:
		herr = c.call(ctx, p.tx, news[0])
	}
	if herr == nil && p.check {
		herr = checkDeferred(ctx, p.tx)
	}
	p.st.Handle += time.Since(t)
	if herr != nil {
		if lost = connLost(p.tx, herr, time.Since(t), c.idleTx); lost == nil {
			herr = idleErr(p.tx, herr, time.Since(t), c.idleTx)
		}
	}
	return herr, lost
}

// isolateOne claims and handles one message under a savepoint.
func (c *Consumer) isolateOne(ctx context.Context, p *isolation, it *item) error {
	tx := p.tx
	if _, err := tx.Exec(ctx, "SAVEPOINT effectively_msg"); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	news, err := c.claim(ctx, tx, []*item{it}, p.st)
	var ke *dedupe.KeyError
	switch {
	case errors.As(err, &ke):
		if err := rollbackTo(ctx, tx, "effectively_msg"); err != nil {
			return err
		}
		it.reset()
		it.keyErr = ke
		it.park(parked.ReasonInvalidKey, ke, false)
	case err != nil:
		return err
	case len(news) == 1 && it.failed != nil:
		c.parkFailed(it) // parked after failing in an earlier pass
	case len(news) == 1:
		herr, lost := c.handle(ctx, p, news)
		switch {
		case lost != nil:
			return lost
		case herr == nil:
			it.outcome = OutcomeApplied
		default:
			if err := rollbackTo(ctx, tx, "effectively_msg"); err != nil {
				return err
			}
			it.reset()
			c.recordFailure(it, herr)
			if !it.failedPark {
				it.retry(it.failed, c.retryDelay(it))
				p.gate.handBack(it)
				break
			}
			// Claim again so the parked row commits with a marker.
			if news, err := c.claim(ctx, tx, []*item{it}, p.st); err != nil {
				return err
			} else if len(news) == 1 {
				c.parkFailed(it)
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
	group = pending(group) // some may have been held back by a failure before them
	switch len(group) {
	case 0:
		return nil
	case 1:
		return c.isolateOne(ctx, p, group[0])
	}
	tx := p.tx
	if _, err := tx.Exec(ctx, "SAVEPOINT effectively_group"); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	news, err := c.claim(ctx, tx, group, p.st)
	var herr error
	var ke *dedupe.KeyError
	switch {
	case errors.As(err, &ke):
		herr = ke // split until the refused key is alone
	case err != nil:
		return err
	default:
		news = c.parkDecided(news) // failed alone before: parked with its marker
		if len(news) > 0 {
			var lost error
			if herr, lost = c.handle(ctx, p, news); lost != nil {
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
	if err := rollbackTo(ctx, tx, "effectively_group; RELEASE SAVEPOINT effectively_group"); err != nil {
		return err
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

func rollbackTo(ctx context.Context, tx pgx.Tx, savepoint string) error {
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
		return fmt.Errorf("rollback to savepoint: %w", err)
	}
	return nil
}
