package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/consumer/internal/merge"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
)

// One batch, stage by stage (see docs/architecture.md):
//
//	keys     deriveKeys (keys.go): every message's key, or why it has none
//	passes   decide (this file): passes over the batch until one commits;
//	         each pass begins its transaction (this file) and runs, once
//	         each:
//	  admit    (order.go) what may run now; the ordering decision
//	  claim    (claim.go) the strategy's verdicts; duplicates settle here
//	  await    a PipelineSource's lane: the batch before it settled (before
//	           admit for a sequenced strategy)
//	  handle   (handle.go) fast, or under savepoints (isolate.go)
//	  commit   (commit.go) parked rows, the source's state, COMMIT, and
//	           the strategy told what committed
//	settle   (settle.go) acknowledge or hand back, count, report
//
// A pass that a handler failure ends is rolled back; the next pass knows
// the failure (item.failed) and runs without that message.

// item is one message's state while its batch is processed. The fields
// above the line are decided once per delivery; those below, by each pass.
type item struct {
	m      *Message
	idx    int // its place in the batch
	key    dedupe.Key
	keyErr error // the key is unusable: the message is parked with this error
	// tries counts the deliveries that were real attempts, not waits.
	tries int
	// failed holds a handler error seen in an earlier, rolled-back pass,
	// together with the decision taken on it.
	failed     error
	failedPark bool
	// runs counts the handler calls for this delivery, across passes.
	runs int

	verdict   dedupe.Verdict // from the claim of this pass
	outcome   Outcome
	err       error         // handler error, for retried and parked messages
	delay     time.Duration // for retried messages
	reason    string        // for parked messages
	hasMarker bool          // a marker commits with the parked row
	// waiting is true for a message retried because it must wait (a
	// sequence gap, or an earlier message of its sender awaiting a retry):
	// waiting does not count as failing.
	waiting bool
}

func (it *item) attempt() int {
	if it.m.Attempt < 1 {
		return 1
	}
	return it.m.Attempt
}

// reset forgets what a rolled-back pass decided.
func (it *item) reset() {
	it.verdict, it.outcome, it.err, it.delay, it.reason, it.hasMarker, it.waiting = 0, 0, nil, 0, "", false, false
}

func (it *item) park(reason string, err error, hasMarker bool) {
	it.outcome, it.reason, it.err, it.hasMarker = OutcomeParked, reason, err, hasMarker
}

func (it *item) retry(err error, delay time.Duration) {
	it.outcome, it.err, it.delay = OutcomeRetried, err, delay
}

var errHandlerFailed = errors.New("handler failed")

// process runs one batch through the protocol and settles it with the source.
func (c *Consumer) process(ctx context.Context, b *Batch) error {
	start := time.Now()
	ctx, st := c.beginBatch(ctx, b)
	items := c.deriveKeys(b.Messages)
	err := c.decide(ctx, b, items, st)
	return c.settle(ctx, b, items, st, err, start)
}

// passMode is how a pass runs its handlers.
type passMode struct {
	// isolated runs the handlers under savepoints, to find failing
	// messages: those from the batch's place from on; the ones before it
	// ran without failing in the pass before and run fast again.
	isolated bool
	from     int
	check    bool // and the deferred constraints after each
	// unmerged sends a QueueHandler's statements as queued: a merged
	// INSERT failed (consumer/internal/merge).
	unmerged bool
}

// decide runs passes over the batch until one commits. The first runs the
// whole batch in one transaction without savepoints. When a QueueHandler's
// message fails, up to maxQueuedPasses pipelined passes run without the
// messages that failed, then the rest is isolated as for a Handler. When a Handler fails,
// the second runs the messages before it fast again and isolates the rest
// under savepoints, so that a deterministic handler runs at most twice for
// a healthy message however many of its batch-mates fail; a BatchHandler's
// batch is bisected under savepoints. Should the second pass fail anyway
// (a handler that failed before did not fail the first time), the next
// isolates the whole batch.
//
// When the COMMIT itself is refused because of what the batch wrote (a
// deferred constraint or constraint trigger), the batch is isolated with
// the deferred checks run after each message (or group, for a
// BatchHandler), so the message that makes the commit fail is retried or
// parked like a failing handler and the rest commits. Should the commit
// still be refused with no message to blame, every message that ran counts
// the refusal as a failed attempt, so the batch ends parked rather than
// looping.
func (c *Consumer) decide(ctx context.Context, b *Batch, items []*item, st *BatchStats) error {
	var mode passMode
	for attempt := 1; ; attempt++ {
		if attempt > 1 && c.pipeline != nil {
			c.pipeline.Recall(b)
		}
		st.Isolated = st.Isolated || mode.isolated
		err := c.pass(ctx, b, items, st, mode)
		var ke *dedupe.KeyError
		var ce *commitError
		switch {
		case err == nil:
			return nil
		case errors.Is(err, errHandlerFailed):
			switch {
			case mode.isolated:
				mode.from = 0
			case c.cfg.QueueHandler != nil && attempt < maxQueuedPasses:
				// Pipelined again without the failed message: a pass costs
				// about what isolating a few messages does.
			case c.cfg.QueueHandler != nil:
				mode = passMode{isolated: true, from: queuedFrom(items), unmerged: mode.unmerged}
			default:
				mode = passMode{isolated: true, from: failedFrom(items, c.cfg.Handler != nil)}
			}
			continue
		case errors.Is(err, merge.ErrMerged):
			mode.unmerged = true
			continue
		case errors.Is(err, errUnattributed):
			c.log.Warn("a queued statement's arguments could not be encoded; isolating the batch", "lane", b.Lane, "err", err)
			mode = passMode{isolated: true, unmerged: mode.unmerged}
			continue
		case errors.As(err, &ke) && markInvalid(items, ke):
			// The strategy refused a key the consumer could not know it
			// needs (a sequence strategy given a key without a sender, say):
			// park that message and run the batch again.
			continue
		case errors.As(err, &ce) && ce.kind == commitRefused:
			c.log.Warn("commit refused; isolating the message that makes it fail", "lane", b.Lane, "err", err)
			if !mode.check {
				mode = passMode{isolated: true, check: true}
				continue
			}
			if c.blameApplied(items, ce) {
				continue
			}
			return err
		default:
			return err
		}
	}
}

// pass is one attempt at the batch in one transaction: admit, claim,
// handle (fast, then isolated from mode.from on), commit. A handler failure rolls everything back and returns
// errHandlerFailed, with the failure recorded on its item for the next
// pass.
func (c *Consumer) pass(ctx context.Context, b *Batch, items []*item, st *BatchStats, mode passMode) error {
	for _, it := range items {
		it.reset()
	}
	tx, err := c.begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	if c.pipeline != nil && c.sequenced {
		if err := c.pipeline.AwaitPrevious(ctx, b); err != nil {
			return fmt.Errorf("source: %w", err)
		}
	}
	run, g := c.admit(items)
	fast, slow := run, []*item(nil)
	if mode.isolated {
		i := 0
		for i < len(run) && run[i].idx < mode.from {
			i++
		}
		fast, slow = run[:i], run[i:]
	}
	news, err := c.claim(ctx, tx, fast, st)
	if err != nil {
		return err
	}
	if c.pipeline != nil && !c.sequenced {
		// Claimed while the lane's last batch committed; its handlers may
		// read what that one wrote.
		if err := c.pipeline.AwaitPrevious(ctx, b); err != nil {
			return fmt.Errorf("source: %w", err)
		}
	}
	idle, err := c.handleAll(ctx, tx, c.parkDecided(news), st, mode)
	if err != nil {
		return c.blameIdle(tx, idle, err)
	}
	if len(slow) > 0 {
		if err := c.isolate(ctx, &isolation{tx: tx, st: st, gate: g, check: mode.check}, slow); err != nil {
			return err
		}
	}
	return c.blameIdle(tx, idle, c.commit(ctx, tx, b, items, st))
}

// idleSQL is what every batch transaction runs after BEGIN, in the same
// simple-protocol round trip: with a positive IdleTxTimeout it sets
// idle_in_transaction_session_timeout for the transaction.
func idleSQL(idle time.Duration) string {
	if idle <= 0 {
		return ""
	}
	return fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout = %d", max(idle.Milliseconds(), 1))
}

// begin starts a batch transaction, bounded by IdleTxTimeout.
func (c *Consumer) begin(ctx context.Context) (pgx.Tx, error) {
	if c.idleSQL == "" {
		return c.db.Begin(ctx)
	}
	if b := pg.Beginner(c.db); b != nil {
		return b.BeginTx(ctx, pgx.TxOptions{BeginQuery: "BEGIN; " + c.idleSQL})
	}
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, c.idleSQL); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return tx, nil
}

// blameIdle turns err, when tx's connection was lost after handlers in
// idle kept the transaction idle for longer than the idle timeout, into
// their failure: the server most likely ended the session
// (idle_in_transaction_session_timeout), which counts as an attempt of
// theirs (a redelivery as a lost connection or an unknown outcome would
// meet the same end for ever).
func (c *Consumer) blameIdle(tx pgx.Tx, idle []*item, err error) error {
	var ue *UnavailableError
	if err == nil || len(idle) == 0 || errors.Is(err, errHandlerFailed) || errors.As(err, &ue) {
		return err
	}
	if conn := tx.Conn(); conn == nil || !conn.IsClosed() {
		return err
	}
	for _, it := range idle {
		c.recordFailure(it, &IdleTxError{Timeout: c.idleTx, Err: err})
	}
	return errHandlerFailed
}

// failedFrom is where the second pass starts isolating: after the one
// message that failed a Handler's fast pass, whose batch-mates before it
// ran without failing; the whole batch otherwise.
func failedFrom(items []*item, perMessage bool) int {
	if !perMessage {
		return 0
	}
	from := -1
	for _, it := range items {
		if it.failed != nil {
			if from >= 0 {
				return 0
			}
			from = it.idx + 1
		}
	}
	return max(from, 0)
}

// maxQueuedPasses is how many pipelined passes a QueueHandler's batch
// gets, each without the messages that failed before, until the rest is
// isolated message by message.
const maxQueuedPasses = 4

// queuedFrom is where a QueueHandler's batch starts isolating after its
// pipelined passes: after the last message that failed, since the
// statements before it ran without failing in the pass that found it.
func queuedFrom(items []*item) int {
	from := 0
	for _, it := range items {
		if it.failed != nil {
			from = it.idx + 1
		}
	}
	return from
}

// blameApplied records a refused commit as a failure of every message that
// ran its handler in the refused pass. It reports false when there was none.
func (c *Consumer) blameApplied(items []*item, ce *commitError) bool {
	blamed := false
	for _, it := range items {
		if it.outcome == OutcomeApplied && it.failed == nil {
			c.recordFailure(it, ce)
			blamed = true
		}
	}
	return blamed
}

// markInvalid parks the messages whose key a strategy refused. It reports
// false when ke names no key of the batch.
func markInvalid(items []*item, ke *dedupe.KeyError) bool {
	found := false
	for _, it := range items {
		if it.keyErr == nil && sameKey(it.key, ke.Key) {
			it.keyErr = ke
			found = true
		}
	}
	return found
}

func sameKey(a, b dedupe.Key) bool {
	return a.Scope == b.Scope && a.ID == b.ID && a.Sender == b.Sender && a.Seq == b.Seq
}
