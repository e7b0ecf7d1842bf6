package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
)

// item is one message's state while its batch is processed.
type item struct {
	m      *Message
	key    dedupe.Key
	keyErr error // the key is unusable: the message is parked with this error

	verdict   dedupe.Verdict // from the claim that committed
	outcome   Outcome
	err       error         // handler error, for retried and parked messages
	delay     time.Duration // for retried messages
	reason    string        // for parked messages
	hasMarker bool          // a marker commits with the parked row

	// failed holds a handler error seen in an earlier, rolled-back attempt
	// of this batch, together with the decision taken on it.
	failed     error
	failedPark bool
	// tries counts the deliveries that were real attempts, not waits.
	tries int
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

// reset forgets what a rolled-back attempt decided.
func (it *item) reset() {
	it.verdict, it.outcome, it.err, it.delay, it.reason, it.hasMarker, it.waiting = 0, 0, nil, 0, "", false, false
}

var errHandlerFailed = errors.New("handler failed")

// maxFastAttempts is how many times a batch runs without savepoints before
// failures are isolated message by message.
const maxFastAttempts = 2

// process runs one batch through the protocol and settles it with the source.
func (c *Consumer) process(ctx context.Context, b *Batch) error {
	start := time.Now()
	ctx, st := c.beginBatch(ctx, b)
	items := c.deriveKeys(b.Messages)

	err := c.settleInTx(ctx, b, items, st)
	if err != nil {
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
			c.log.Info("batch dropped: lane fenced by a newer owner", "lane", b.Lane, "err", err)
		case unknown:
			c.log.Warn("connection lost during commit: the batch may or may not have committed; its messages will be delivered again and recognised as duplicates if it did",
				"lane", b.Lane, "size", len(items), "err", err)
		default:
			c.log.Error("batch rolled back; its messages will be delivered again", "lane", b.Lane, "size", len(items), "err", err)
		}
		if !st.Fenced {
			// Their next delivery is not a failure of theirs.
			c.waits.abandoned(items)
		}
		if serr := c.src.Settle(ctx, b, nil, nil); serr != nil {
			c.log.Error("settle failed", "lane", b.Lane, "err", serr)
		}
		st.Total = time.Since(start)
		c.report(ctx, st, items)
		if st.Fenced {
			return nil
		}
		return err
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
		c.log.Error("acknowledging a committed batch failed; its messages may be delivered again", "lane", b.Lane, "err", err)
	}
	st.Ack = time.Since(t)
	st.Total = time.Since(start)
	c.report(ctx, st, items)
	return nil
}

// deriveKeys runs the KeyFunc and validates each key.
func (c *Consumer) deriveKeys(msgs []*Message) []*item {
	items := make([]*item, len(msgs))
	for i, m := range msgs {
		it := &item{m: m}
		items[i] = it
		k, err := c.keyOf(m)
		if err == nil {
			if k.Scope == "" {
				k.Scope = c.cfg.Scope
			}
			if k.Fingerprint == nil && !c.cfg.NoFingerprint {
				k.Fingerprint = dedupe.Fingerprint(m.Value)
			}
			err = dedupe.Validate(k, c.cfg.MaxKeyLen)
		}
		if err == nil && k.ID == "" && k.Sender == "" {
			err = &dedupe.KeyError{Key: k, Reason: "no dedupe key: the message has no ID and no sender"}
		}
		if err == nil && c.checker != nil {
			err = c.checker.CheckKey(k)
		}
		it.key, it.keyErr = k, err
		m.DedupeKey = k
		it.tries = c.waits.failures(m)
	}
	return items
}

func (c *Consumer) keyOf(m *Message) (k dedupe.Key, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return c.cfg.KeyFunc(m)
}

// settleInTx decides every message's outcome and commits it. It first runs
// the whole batch in one transaction without savepoints; when a handler
// fails it rolls back and runs the batch again without the failed message,
// and when failures keep coming it isolates them under savepoints.
//
// When the COMMIT itself is refused because of what the batch wrote (a
// deferred constraint or constraint trigger), the batch is isolated with
// the deferred checks run after each message (or group, for a
// BatchHandler), so the message that makes the commit fail is retried or
// parked like a failing handler and the rest commits. Should the commit
// still be refused with no message to blame, every message that ran counts
// the refusal as a failed attempt, so the batch ends parked rather than
// looping.
func (c *Consumer) settleInTx(ctx context.Context, b *Batch, items []*item, st *BatchStats) error {
	check := false
	for attempt := 1; ; attempt++ {
		for _, it := range items {
			it.reset()
		}
		var err error
		if !check && attempt <= maxFastAttempts && (c.cfg.Handler != nil || attempt == 1) {
			err = c.runFast(ctx, b, items, st)
		} else {
			st.Isolated = true
			err = c.runIsolated(ctx, b, items, st, check)
		}
		var ke *dedupe.KeyError
		var ce *commitError
		switch {
		case err == nil:
			return nil
		case errors.Is(err, errHandlerFailed):
			continue
		case errors.As(err, &ke) && markInvalid(items, ke):
			// The strategy refused a key the consumer could not know it
			// needs (a sequence strategy given a key without a sender, say):
			// park that message and run the batch again.
			continue
		case errors.As(err, &ce) && ce.kind == commitRefused:
			c.log.Warn("commit refused; isolating the message that makes it fail", "lane", b.Lane, "err", err)
			if !check {
				check = true
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

// runFast is one attempt at the batch in a single transaction: one claim for
// all keys, every handler, one insert of parked rows, commit. A handler
// failure rolls everything back and returns errHandlerFailed, with the
// failure recorded on its item for the next attempt.
func (c *Consumer) runFast(ctx context.Context, b *Batch, items []*item, st *BatchStats) error {
	tx, err := c.begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	todo, _ := c.prepare(items)
	news, err := c.claim(ctx, tx, todo, st)
	if err != nil {
		return err
	}
	t := time.Now()
	idle := c.cfg.IdleTxTimeout
	var slow []*item // handler calls that outlasted IdleTxTimeout
	if c.cfg.BatchHandler != nil {
		if len(news) > 0 {
			if err := c.callBatch(ctx, tx, news); err != nil {
				st.Handle += time.Since(t)
				if lost := connLost(tx, err, time.Since(t), c.cfg.IdleTxTimeout); lost != nil {
					return lost
				}
				if len(news) == 1 {
					c.recordFailure(news[0], err)
				}
				return errHandlerFailed
			}
		}
		if idle > 0 && time.Since(t) > idle {
			slow = news
		}
		for _, it := range news {
			it.outcome = OutcomeApplied
		}
	} else {
		for _, it := range news {
			if it.failed != nil {
				// Parked after failing in an earlier attempt: its marker
				// commits with the parked row; the handler does not run again.
				c.parkFailed(it)
				continue
			}
			ht := time.Now()
			if err := c.call(ctx, tx, it.m); err != nil {
				st.Handle += time.Since(t)
				if lost := connLost(tx, err, time.Since(ht), c.cfg.IdleTxTimeout); lost != nil {
					return lost
				}
				c.recordFailure(it, err)
				return errHandlerFailed
			}
			if idle > 0 && time.Since(ht) > idle {
				slow = append(slow, it)
			}
			it.outcome = OutcomeApplied
		}
	}
	st.Handle += time.Since(t)
	err = c.commit(ctx, tx, b, items, st)
	if err != nil && len(slow) > 0 {
		if conn := tx.Conn(); conn != nil && conn.IsClosed() {
			// The server most likely ended the session while a handler
			// kept the transaction idle: the handler's failure, which
			// counts as an attempt (a redelivery as an unknown outcome
			// would meet the same end for ever).
			for _, it := range slow {
				c.recordFailure(it, &IdleTxError{Timeout: idle, Err: err})
			}
			return errHandlerFailed
		}
	}
	return err
}

// prepare settles the messages that need no claim (unusable keys, failures
// already decided, messages that must wait behind an earlier message of
// their sender) and returns the rest, in order.
//
// For a sequenced strategy it also returns, per sender, the lowest sequence
// number of this batch that is to be retried: the sender's later messages
// must wait for it.
func (c *Consumer) prepare(items []*item) ([]*item, map[senderRef]int64) {
	held := map[senderRef]int64{}
	if c.sequenced {
		for _, it := range items {
			if it.failed != nil && !it.failedPark {
				hold(held, it)
			}
		}
	}
	// Sequence numbers of this batch that go to the claim ahead of a given
	// message: one of them awaiting redelivery since an earlier batch does
	// not hold the message back, since it is here and goes first.
	ahead := map[senderRef]map[int64]bool{}
	var todo []*item
	for _, it := range items {
		switch {
		case it.keyErr != nil:
			it.park(ReasonInvalidKey, it.keyErr, false)
		case it.failed != nil && !it.failedPark:
			it.retry(it.failed, c.retryDelay(it))
		case c.sequenced && it.key.Sender != "" && (mustWait(it, held) || c.waits.behind(it.key, ahead[senderRef{it.key.Scope, it.key.Sender}])):
			c.wait(it, "an earlier message of its sender is waiting for a retry")
			if it.outcome == OutcomeRetried {
				// Waiting, it holds its sender's later messages of this
				// batch back too, even behind a copy of the one it waits for.
				hold(held, it)
			}
		default:
			todo = append(todo, it)
			if c.sequenced && it.key.Sender != "" {
				sr := senderRef{it.key.Scope, it.key.Sender}
				if ahead[sr] == nil {
					ahead[sr] = map[int64]bool{}
				}
				ahead[sr][it.key.Seq] = true
			}
		}
	}
	return todo, held
}

// hold records that it is to be retried, so its sender's later messages in
// the batch wait for it.
func hold(held map[senderRef]int64, it *item) {
	if it.keyErr != nil || it.key.Sender == "" {
		return
	}
	sr := senderRef{it.key.Scope, it.key.Sender}
	if seq, ok := held[sr]; !ok || it.key.Seq < seq {
		held[sr] = it.key.Seq
	}
}

// mustWait reports whether an earlier message of its sender in this batch
// is to be retried. (Earlier batches' messages awaiting redelivery were
// checked by prepare; they cannot change while the batch runs.)
func mustWait(it *item, held map[senderRef]int64) bool {
	seq, ok := held[senderRef{it.key.Scope, it.key.Sender}]
	return ok && it.key.Seq > seq
}

// wait hands a message back to wait for an earlier one, or parks it with
// reason gap when it has waited Config.GapMaxAttempts deliveries.
func (c *Consumer) wait(it *item, why string) {
	if it.attempt() >= c.cfg.GapMaxAttempts {
		it.park(ReasonGap, fmt.Errorf("sequence gap: %s waited %d deliveries: %s", it.key, it.attempt(), why), false)
		return
	}
	it.retry(nil, c.cfg.GapDelay)
	it.waiting = true
}

// claim asks the strategy for the verdicts of items, settles every item
// that is not new, and returns the new ones in order.
func (c *Consumer) claim(ctx context.Context, tx pgx.Tx, items []*item, st *BatchStats) ([]*item, error) {
	if len(items) == 0 {
		return nil, nil
	}
	keys := make([]dedupe.Key, len(items))
	for i, it := range items {
		keys[i] = it.key
	}
	t := time.Now()
	verdicts, err := c.cfg.Strategy.Claim(ctx, tx, keys)
	st.Claim += time.Since(t)
	if err != nil {
		var ke *dedupe.KeyError
		if errors.As(err, &ke) {
			return nil, ke
		}
		return nil, fmt.Errorf("claim (%s): %w", c.cfg.Strategy.Name(), err)
	}
	if len(verdicts) != len(keys) {
		return nil, fmt.Errorf("claim (%s): %d verdicts for %d keys", c.cfg.Strategy.Name(), len(verdicts), len(keys))
	}
	news := items[:0:0]
	for i, it := range items {
		it.verdict = verdicts[i]
		switch verdicts[i] {
		case dedupe.VerdictNew:
			news = append(news, it)
		case dedupe.VerdictDuplicate:
			it.outcome = OutcomeDuplicate
		case dedupe.VerdictMismatch:
			if c.cfg.OnMismatch == MismatchPark {
				it.park(ReasonMismatch, fmt.Errorf("key %s was processed before with another payload", it.key), true)
			} else {
				it.outcome = OutcomeMismatch
			}
		case dedupe.VerdictGap:
			c.wait(it, "an earlier sequence number has not arrived")
		default:
			return nil, fmt.Errorf("claim (%s): invalid verdict %d for key %s", c.cfg.Strategy.Name(), verdicts[i], it.key)
		}
	}
	return news, nil
}

// commit writes the parked rows and the source's state, then commits.
func (c *Consumer) commit(ctx context.Context, tx pgx.Tx, b *Batch, items []*item, st *BatchStats) error {
	t := time.Now()
	var park []parkRow
	var ack []*Message
	for _, it := range items {
		if it.outcome == OutcomeParked {
			park = append(park, parkRow{it: it, reason: it.reason, err: it.err, hasMarker: it.hasMarker})
		}
		if it.outcome != OutcomeRetried {
			ack = append(ack, it.m)
		}
	}
	if err := c.insertParked(ctx, tx, park); err != nil {
		return fmt.Errorf("park: %w", err)
	}
	if c.txsrc != nil {
		if err := c.txsrc.BeforeCommit(ctx, tx, b, ack); err != nil {
			return fmt.Errorf("source: %w", err)
		}
	}
	if err := commitTx(ctx, tx); err != nil {
		return err
	}
	st.Commit += time.Since(t)
	if c.committer != nil {
		var keys []dedupe.Key
		var verdicts []dedupe.Verdict
		for _, it := range items {
			if it.verdict == 0 || it.verdict == dedupe.VerdictGap || it.outcome == OutcomeRetried {
				continue
			}
			keys = append(keys, it.key)
			verdicts = append(verdicts, it.verdict)
		}
		if len(keys) > 0 {
			c.committer.Committed(keys, verdicts)
		}
	}
	return nil
}

// recordFailure decides, once per batch, what a handler failure means for
// its message: park it (permanent, or out of attempts) or retry it later.
func (c *Consumer) recordFailure(it *item, err error) {
	it.failed = err
	it.failedPark = IsPermanent(err) || (it.tries >= c.cfg.MaxAttempts && !c.keepRetrying)
	var pe *PanicError
	if errors.As(err, &pe) {
		c.log.Error("handler panicked", "ref", it.m.Ref, "key", it.key.String(), "panic", fmt.Sprint(pe.Value), "stack", string(pe.Stack))
	}
}

func (c *Consumer) parkFailed(it *item) {
	reason := ReasonMaxAttempts
	if IsPermanent(it.failed) {
		reason = ReasonPermanent
	}
	it.park(reason, it.failed, true)
}

func (c *Consumer) retryDelay(it *item) time.Duration {
	return backoff(c.cfg.RetryBackoff, c.cfg.MaxRetryBackoff, it.tries)
}

func (it *item) park(reason string, err error, hasMarker bool) {
	it.outcome, it.reason, it.err, it.hasMarker = OutcomeParked, reason, err, hasMarker
}

func (it *item) retry(err error, delay time.Duration) {
	it.outcome, it.err, it.delay = OutcomeRetried, err, delay
}

// call runs the Handler, turning a panic into a *PanicError.
func (c *Consumer) call(ctx context.Context, tx pgx.Tx, m *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return c.cfg.Handler(ctx, tx, m)
}

// callBatch runs the BatchHandler, turning a panic into a *PanicError.
func (c *Consumer) callBatch(ctx context.Context, tx pgx.Tx, items []*item) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	msgs := make([]*Message, len(items))
	for i, it := range items {
		msgs[i] = it.m
	}
	return c.cfg.BatchHandler(ctx, tx, msgs)
}
