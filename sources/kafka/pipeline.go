package kafka

import (
	"context"
	"errors"
	"fmt"

	"github.com/effectively-once/effectively/consumer"
)

// Pipelining: a partition's next batch is handed out while its last one
// commits. BeforeCommit, once it has stored the partition's offset in the
// batch transaction, releases the lane (lanes.Lanes.Release), and the
// next batch is fetched and claimed by another of the consumer's
// goroutines while the COMMIT runs. Before its handlers (before its claim,
// for a sequenced strategy) the consumer calls AwaitPrevious, which waits
// for the released batch to be settled and lets the next one go on only
// when nothing the first left undone concerns it: every message
// acknowledged, or retried after a delay (the partition goes on with later
// messages then too). Otherwise the next batch rolls back and is handed
// back whole, so its messages are delivered again after those before
// them, and nothing commits out of order. Its BeforeCommit, which stores
// the offset after it, cannot run before the first was settled.

// release is one lane's batch released while it commits, as the batch
// handed out after it sees it.
type release struct {
	b    *consumer.Batch
	done chan struct{} // closed once err is decided
	err  error         // nil: the batch after b may go on
}

var errPreviousRunsAgain = errors.New("the batch before it on its partition failed to commit and runs again")

// finish decides r: err nil lets the batch after r's go on.
func (r *release) finish(err error) {
	select {
	case <-r.done:
		return
	default:
	}
	r.err = err
	close(r.done)
}

// Pipeline is called by a consumer that calls AwaitPrevious and Recall
// (see consumer.PipelineSource): from then on, with Config.Pipeline, a
// partition's next batch is handed out while its last one commits.
// Otherwise Source hands out one batch per partition at a time, from Fetch
// until Settle.
func (s *Source) Pipeline() { s.pipelined.Store(s.cfg.Pipeline) }

// released records, after BeforeCommit stored b's offset, that b's lane
// may hand out its next batch. s.mu must be held.
func (s *Source) released(l *lane, b *consumer.Batch) {
	if s.pipelined.Load() && s.sched.Release(b) {
		s.releases.Add(1)
		if l.rel != nil && l.rel.b != b {
			l.lastRel = l.rel
		}
		l.rel = &release{b: b, done: make(chan struct{})}
	}
}

// bindWaiter records, as b is handed out, the release b waits for: that
// of the batch committing when the scheduler handed b out. s.mu must be
// held.
func (s *Source) bindWaiter(l *lane, b *consumer.Batch, after *consumer.Batch) {
	l.waiter, l.waitFor = nil, nil
	if after == nil {
		return
	}
	l.waiter = b
	switch {
	case l.rel != nil && l.rel.b == after:
		l.waitFor = l.rel
	case l.lastRel != nil && l.lastRel.b == after:
		l.waitFor = l.lastRel
	default:
		// Not known: cannot happen; refuse to run b out of order.
		r := &release{b: after, done: make(chan struct{})}
		r.finish(fmt.Errorf("kafka: partition %s: the batch handed out before this one is unknown", l.name))
		l.waitFor = r
	}
}

// settledRelease decides the release of b, if b was released, as b is
// settled with ack and retry, or dropped (dropped non-nil). s.mu must be
// held.
func (s *Source) settledRelease(l *lane, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry, dropped error) {
	r := l.rel
	if r == nil || r.b != b {
		return
	}
	l.lastRel, l.rel = r, nil
	if dropped != nil {
		r.finish(dropped)
		return
	}
	r.finish(wholeOrLater(l, b, ack, retry))
}

// wholeOrLater returns nil when every message of b was acknowledged or
// retried after a delay: the batch after b then runs as it would have
// after b was settled.
func wholeOrLater(l *lane, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	settled := make(map[*consumer.Message]bool, len(b.Messages))
	for _, m := range ack {
		settled[m] = true
	}
	for _, r := range retry {
		if r.Delay > 0 {
			settled[r.Message] = true
		}
	}
	for _, m := range b.Messages {
		if !settled[m] {
			return fmt.Errorf("kafka: partition %s: the batch before this one did not commit whole (offset %d is delivered again), so this one rolls back and is delivered again after it", l.name, offsetOf(m))
		}
	}
	return nil
}

// AwaitPrevious waits until the batch handed out before b on its
// partition, if it was still committing then, has been settled, and
// returns nil when b may go on (see consumer.PipelineSource); an error
// wrapping consumer.ErrFenced when the partition was lost meanwhile.
func (s *Source) AwaitPrevious(ctx context.Context, b *consumer.Batch) error {
	l, ok := b.SourceData.(*lane)
	if !ok {
		return fmt.Errorf("kafka: AwaitPrevious with a batch of another source")
	}
	s.mu.Lock()
	var r *release
	if l.waiter == b {
		r = l.waitFor
	}
	s.mu.Unlock()
	if r == nil {
		return nil
	}
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Recall is called before a batch runs another pass: if its BeforeCommit
// released its lane, the batch handed out after it rolls back (its claims
// may hold what the new pass claims) and the lane hands nothing more out
// until the batch is settled or released again.
func (s *Source) Recall(b *consumer.Batch) {
	l, ok := b.SourceData.(*lane)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.rel == nil || l.rel.b != b {
		return
	}
	s.sched.Hold(b)
	l.rel.finish(fmt.Errorf("kafka: partition %s: %w, so this one rolls back and is delivered again after it", l.name, errPreviousRunsAgain))
	l.lastRel, l.rel = l.rel, nil
}

// dropReleases ends the releases of l, whose batches can no longer be
// settled (the partition was revoked or fenced). s.mu must be held.
func (s *Source) dropReleases(l *lane, err error) {
	if l.rel != nil {
		l.rel.finish(err)
		l.lastRel, l.rel = l.rel, nil
	}
	if l.waitFor != nil {
		l.waitFor.finish(err)
	}
}

var _ consumer.PipelineSource = (*Source)(nil)
