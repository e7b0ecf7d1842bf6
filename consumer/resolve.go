package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/dedupe"
)

// A COMMIT whose reply was lost (the connection broke, the server ended
// the session, the batch's context was cancelled while it was on its way)
// may or may not have committed. The consumer finds out before it settles
// the batch, on another connection: the markers the batch's applied and
// parked messages claimed were written in its transaction, so a claim of
// the same keys in a transaction that is then rolled back sees them as
// duplicates exactly when the batch committed. The messages are then
// settled with their real outcomes (acknowledged when it committed, handed
// back when it did not); only when the database cannot be asked within
// resolveTimeout do they stay unknown.

// resolveMinTimeout is the least time the consumer spends finding out
// whether a batch whose COMMIT lost its reply committed. A transaction
// whose COMMIT never reached the server holds its markers' locks until the
// server ends its session (IdleTxTimeout), and the probe's claim waits for
// them, so the bound is at least twice that.
const resolveMinTimeout = 30 * time.Second

// errCommitLost is the error of a batch whose COMMIT lost its reply and
// that, as the consumer found out afterwards, did not commit.
var errCommitLost = errors.New("connection lost during COMMIT, and the batch did not commit")

// resolveCommit finds out whether the batch of items, whose COMMIT failed
// with ce (commitUnknown), committed. It returns nil when it did (or when
// no message's outcome depends on it), after telling the strategy what
// committed; an error wrapping errCommitLost when it did not; and ce when
// it cannot tell.
func (c *Consumer) resolveCommit(ctx context.Context, b *Batch, items []*item, st *BatchStats, ce *commitError) error {
	var keys []dedupe.Key
	parkedOnly := false // a parked row without a marker: only the row says
	for _, it := range items {
		switch {
		case it.verdict == dedupe.VerdictNew && (it.outcome == OutcomeApplied || it.outcome == OutcomeParked && it.hasMarker):
			keys = append(keys, it.key)
		case it.outcome == OutcomeParked:
			parkedOnly = true
		}
	}
	if len(keys) == 0 && !parkedOnly {
		// Duplicates, mismatches and retries only: their outcomes hold
		// whether or not the transaction committed (the markers were there
		// before it), so they settle as decided.
		c.log.InfoContext(ctx, "connection lost during commit of a batch without new messages; settling it as decided",
			"lane", b.Lane, "size", len(items), "err", ce.err)
		st.CommitLost = true
		if c.standbys == nil { // else once the standbys confirmed it (settle)
			c.committedItems(items)
		}
		return nil
	}
	if len(keys) == 0 {
		return ce
	}
	t := time.Now()
	committed, err := c.probe(ctx, keys)
	st.Commit += time.Since(t)
	switch {
	case err != nil:
		c.log.WarnContext(ctx, "connection lost during commit, and the database could not be asked whether the batch committed",
			"lane", b.Lane, "size", len(items), "err", err)
		return ce
	case committed:
		st.CommitLost = true
		c.log.WarnContext(ctx, "connection lost during commit; the batch had committed, and its messages are acknowledged",
			"lane", b.Lane, "size", len(items), "err", ce.err)
		if c.standbys == nil { // else once the standbys confirmed it (settle)
			c.committedItems(items)
		}
		return nil
	default:
		st.CommitLost = true
		return fmt.Errorf("%w: %w", errCommitLost, ce.err)
	}
}

// probe claims keys in a transaction of its own that it rolls back, and
// reports whether every key already had a marker: the lost transaction
// committed them all, or none. It tries again, with backoff, until
// resolveTimeout passes, since the database may be switching over.
func (c *Consumer) probe(ctx context.Context, keys []dedupe.Key) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.resolveTimeout())
	defer cancel()
	delay := 50 * time.Millisecond
	for {
		committed, err := c.probeOnce(ctx, keys)
		if err == nil {
			return committed, nil
		}
		var ke *dedupe.KeyError
		if errors.As(err, &ke) {
			return false, err
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

func (c *Consumer) probeOnce(ctx context.Context, keys []dedupe.Key) (bool, error) {
	tx, err := c.begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	verdicts, err := c.claimKeys(ctx, tx, keys)
	if err != nil {
		return false, err
	}
	for _, v := range verdicts {
		if v != dedupe.VerdictDuplicate && v != dedupe.VerdictMismatch {
			return false, nil
		}
	}
	return true, nil
}

// resolveTimeout bounds the search for a lost COMMIT's outcome.
func (c *Consumer) resolveTimeout() time.Duration {
	return max(resolveMinTimeout, 2*c.idleTx)
}
