package lanes

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/effectively-once/effectively/consumer"
)

// ErrClosed is returned by Lanes.Next and Lanes.Reserve after
// Lanes.Close.
var ErrClosed = errors.New("lanes: closed")

// ErrStopped is returned by Lanes.Reserve for a lane that was stopped
// or removed (or, without Config.AutoLanes, never opened).
var ErrStopped = errors.New("lanes: lane stopped")

// Config configures a Lanes.
type Config struct {
	// LaneBuffer bounds the messages of one lane that wait for their first
	// delivery, reserved places included (see Lanes.Reserve). Defaults to
	// 0: no bound.
	LaneBuffer int
	// Buffer bounds the same across all lanes. Defaults to 0: no bound.
	Buffer int
	// AutoLanes makes lanes come and go with their messages, as SQS FIFO
	// message groups do: Add and Reserve create a lane they do not know,
	// and a lane is dropped once nothing of it is buffered, reserved,
	// waiting for a retry or in flight. Without it, lanes are made by
	// Open and ended by Remove, and Add refuses a lane it does not know.
	// Defaults to false.
	AutoLanes bool
}

// Lanes is the lane scheduler every source builds on: a source pulls
// messages from its broker and files them under their lane with Add; the
// source's Fetch is Next, its Settle calls Settle (or Finish when the
// broker redelivers by itself). Lanes keeps the order and fairness that
// the Source contract asks for:
//
//   - order within a lane: messages are handed out in the order they were
//     added, and a lane is never handed to two Next calls at once: it is
//     busy from Next until its batch is settled (or released while it
//     commits, see Release);
//   - lanes in parallel: any number of lanes can be in flight at once;
//   - delayed redelivery: a retried message is handed out again once its
//     delay is over, an abandoned one at once, before the lane's messages
//     not yet delivered, in lane order, as a copy of the message handed
//     back (whose reader may still look at it) with
//     [consumer.Message].Attempt one higher;
//   - backpressure: Reserve blocks while a lane (LaneBuffer) or all lanes
//     (Buffer) hold as many undelivered messages as allowed, so that the
//     pulling goroutine stops pulling;
//   - fairness: lanes that have something to hand out are served in the
//     order they became ready, so a lane with a backlog goes to the back
//     after each batch and cannot starve the others.
//
// Waiting is driven by events (an Add, a Settle, a retry falling due), never
// by polling. Lanes is safe for concurrent use. It never calls out to the
// source, so a source may call it while holding its own lock.
type Lanes struct {
	cfg Config

	mu       sync.Mutex
	lanes    map[string]*laneQueue
	ready    []*laneQueue            // have something to hand out now, in the order they became ready
	waiting  map[*laneQueue]struct{} // free, with nothing to hand out until a retry falls due
	fresh    int                     // undelivered messages in all lanes
	reserved int                     // places reserved in all lanes
	blocked  int                     // Reserve calls waiting for room
	wake     chan struct{}           // closed at the next change; nil until waited for
	closed   bool
	err      error // returned by Next while there are no lanes
}

type laneSlot struct {
	seq uint64
	m   *consumer.Message
	due time.Time
}

type laneQueue struct {
	name     string
	data     any
	fresh    []laneSlot // added, never delivered, in lane order
	retries  []laneSlot // handed back, by lane order
	inFlight *consumer.Batch
	seqs     []uint64 // lane order of inFlight's messages, by position
	// committing is a batch that Release let go of the lane while its
	// outcome commits, with the lane order of its messages: it is still
	// to be settled, and inFlight, if any, came after it.
	committing     *consumer.Batch
	committingSeqs []uint64
	held           bool            // committing runs again: hand nothing out (Hold)
	after          *consumer.Batch // committing when inFlight was handed out
	next           uint64          // lane order of the next message added
	reserved       int
	stopped        bool
	removed        bool
	queued         bool // in Lanes.ready
}

// New returns an empty Lanes.
func New(cfg Config) *Lanes {
	return &Lanes{
		cfg:     cfg,
		lanes:   map[string]*laneQueue{},
		waiting: map[*laneQueue]struct{}{},
	}
}

// Open adds a lane whose batches carry data as
// [consumer.Batch].SourceData. A lane of the same name that is still there
// is removed first, as by Remove.
func (s *Lanes) Open(name string, data any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.lanes[name]; old != nil {
		s.removeLocked(old)
	}
	s.lanes[name] = &laneQueue{name: name, data: data}
	s.broadcast()
}

// Stop ends the hand-out of a lane: Next no longer returns its messages and
// Reserve refuses it, while its batch in flight can still be settled.
func (s *Lanes) Stop(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.lanes[name]; l != nil && !l.stopped {
		l.stopped = true
		delete(s.waiting, l)
		s.broadcast()
	}
}

// Remove drops a lane and returns its batch in flight, if any, and the
// messages it held for redelivery, in lane order. Its undelivered messages
// are dropped, and the batch in flight can no longer be settled.
func (s *Lanes) Remove(name string) (inFlight *consumer.Batch, retries []*consumer.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.lanes[name]
	if l == nil {
		return nil, nil
	}
	for _, r := range l.retries {
		retries = append(retries, r.m)
	}
	inFlight = l.inFlight
	if inFlight == nil {
		inFlight = l.committing
	}
	s.removeLocked(l)
	return inFlight, retries
}

func (s *Lanes) removeLocked(l *laneQueue) {
	s.fresh -= len(l.fresh)
	l.fresh, l.retries, l.inFlight, l.seqs = nil, nil, nil, nil
	l.committing, l.committingSeqs, l.held, l.after = nil, nil, false, nil
	l.removed = true
	delete(s.waiting, l)
	delete(s.lanes, l.name)
	s.broadcast()
}

// Reserve waits until the lane (with name "", any lane) has room for an
// undelivered message and reserves up to n places, as many as the bounds
// allow, and returns how many. The places count as buffered until given
// back with Unreserve; reserve before pulling from the broker, Add what
// came, then Unreserve. Reserve returns ErrStopped for a lane that is
// stopped or unknown (without AutoLanes), ErrClosed after Close, or
// ctx's error.
func (s *Lanes) Reserve(ctx context.Context, name string, n int) (int, error) {
	n = max(n, 1)
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return 0, ErrClosed
		}
		var l *laneQueue
		if name != "" {
			l = s.lanes[name]
			if (l == nil && !s.cfg.AutoLanes) || (l != nil && l.stopped) {
				s.mu.Unlock()
				return 0, ErrStopped
			}
		}
		room := n
		if s.cfg.Buffer > 0 {
			room = min(room, s.cfg.Buffer-s.fresh-s.reserved)
		}
		if s.cfg.LaneBuffer > 0 && name != "" {
			held := 0
			if l != nil {
				held = len(l.fresh) + l.reserved
			}
			room = min(room, s.cfg.LaneBuffer-held)
		}
		if room > 0 {
			if name != "" {
				if l == nil {
					l = &laneQueue{name: name}
					s.lanes[name] = l
				}
				l.reserved += room
			}
			s.reserved += room
			s.mu.Unlock()
			return room, nil
		}
		wake := s.waiter()
		s.blocked++
		s.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-wake:
		}
		s.mu.Lock()
		s.blocked--
		s.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return 0, err
		}
	}
}

// Unreserve gives back n places that Reserve reserved for the lane name.
func (s *Lanes) Unreserve(name string, n int) {
	if n <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reserved = max(s.reserved-n, 0)
	if l := s.lanes[name]; name != "" && l != nil {
		l.reserved = max(l.reserved-n, 0)
		s.update(l, time.Now())
	}
	s.broadcast()
}

// Add appends msgs to a lane, in lane order, to be handed out by Next. It
// never blocks (Reserve is what bounds the buffer). It returns false, and
// files nothing, when the lane is stopped or unknown (without AutoLanes) or
// Lanes is closed.
func (s *Lanes) Add(name string, msgs ...*consumer.Message) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.lanes[name]
	if s.closed || (l == nil && !s.cfg.AutoLanes) || (l != nil && l.stopped) {
		return false
	}
	if l == nil {
		l = &laneQueue{name: name}
		s.lanes[name] = l
	}
	s.appendFresh(l, msgs)
	return true
}

// appendFresh files msgs as l's undelivered messages. s.mu must be held.
func (s *Lanes) appendFresh(l *laneQueue, msgs []*consumer.Message) {
	for _, m := range msgs {
		l.fresh = append(l.fresh, laneSlot{seq: l.next, m: m})
		l.next++
	}
	s.fresh += len(msgs)
	s.update(l, time.Now())
	s.broadcast()
}

// SetError makes Next return err, rather than wait, while there are no
// lanes at all (a Kafka source whose consumer group cannot be joined);
// nil clears it.
func (s *Lanes) SetError(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
	s.broadcast()
}

// Next blocks until a lane that is not in flight has messages to hand out
// (added ones, or handed-back ones that are due) and returns up to limit of
// them as a batch of that lane, due redeliveries first; the lane is in
// flight until the batch is settled. It returns ErrClosed after
// Close, the error given to SetError while there are no lanes, or ctx's
// error.
func (s *Lanes) Next(ctx context.Context, limit int) (*consumer.Batch, error) {
	limit = max(limit, 1)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s.mu.Lock()
		// Read under the lock: read before, it would not see as due what a
		// Settle holding the lock meanwhile handed back at once.
		now := time.Now()
		if s.closed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		next := s.promote(now)
		for len(s.ready) > 0 {
			l := s.ready[0]
			s.ready[0] = nil
			s.ready = s.ready[1:]
			l.queued = false
			if !l.handable(now) {
				s.update(l, now)
				continue
			}
			b := s.take(l, limit, now)
			s.mu.Unlock()
			return b, nil
		}
		if s.err != nil && len(s.lanes) == 0 {
			err := s.err
			s.mu.Unlock()
			return nil, err
		}
		wake := s.waiter()
		s.mu.Unlock()

		var due <-chan time.Time
		if !next.IsZero() {
			if timer == nil {
				timer = time.NewTimer(time.Until(next))
			} else {
				timer.Reset(time.Until(next))
			}
			due = timer.C
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-wake:
		case <-due:
		}
	}
}

// take hands out up to limit messages of l. s.mu must be held.
func (s *Lanes) take(l *laneQueue, limit int, now time.Time) *consumer.Batch {
	b := &consumer.Batch{Lane: l.name, SourceData: l.data}
	l.seqs = make([]uint64, 0, min(limit, len(l.retries)+len(l.fresh)))
	if len(l.retries) > 0 {
		kept := l.retries[:0]
		for _, r := range l.retries {
			if len(b.Messages) < limit && !r.due.After(now) {
				// A new delivery: the consumer may still read the last one.
				m := *r.m
				m.Attempt++
				b.Messages = append(b.Messages, &m)
				l.seqs = append(l.seqs, r.seq)
			} else {
				kept = append(kept, r)
			}
		}
		clear(l.retries[len(kept):])
		l.retries = kept
	}
	n := min(limit-len(b.Messages), len(l.fresh))
	for _, f := range l.fresh[:n] {
		b.Messages = append(b.Messages, f.m)
		l.seqs = append(l.seqs, f.seq)
	}
	// Drop the taken slots from the front without moving the rest (a
	// copy per batch would cost the whole buffer each time); append
	// moves only what is left once the array is used up.
	clear(l.fresh[:n])
	l.fresh = l.fresh[n:]
	if len(l.fresh) == 0 {
		l.fresh = nil
	}
	s.fresh -= n
	l.inFlight, l.after = b, l.committing
	delete(s.waiting, l)
	if n > 0 && s.blocked > 0 {
		s.broadcast() // room for Reserve
	}
	return b
}

// promote queues the waiting lanes whose retry fell due and returns when
// the next one falls due (zero: none). s.mu must be held.
func (s *Lanes) promote(now time.Time) time.Time {
	var next time.Time
	for l := range s.waiting {
		due := l.firstDue()
		if !due.After(now) {
			delete(s.waiting, l)
			s.update(l, now)
			continue
		}
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	return next
}

func (l *laneQueue) firstDue() time.Time {
	var first time.Time
	for _, r := range l.retries {
		if first.IsZero() || r.due.Before(first) {
			first = r.due
		}
	}
	return first
}

// handable reports whether Next may hand out l's messages now.
func (l *laneQueue) handable(now time.Time) bool {
	if l.removed || l.stopped || l.inFlight != nil || l.held {
		return false
	}
	return len(l.fresh) > 0 || (len(l.retries) > 0 && !l.firstDue().After(now))
}

// update files l where it belongs after a change: in the ready queue, among
// the lanes waiting for a retry, or, with AutoLanes, dropped when nothing
// of it is left. s.mu must be held.
func (s *Lanes) update(l *laneQueue, now time.Time) {
	switch {
	case l.removed || l.stopped || l.inFlight != nil || l.held:
		delete(s.waiting, l)
	case l.handable(now):
		delete(s.waiting, l)
		if !l.queued {
			l.queued = true
			s.ready = append(s.ready, l)
		}
	case len(l.retries) > 0:
		s.waiting[l] = struct{}{}
	case s.cfg.AutoLanes && len(l.fresh) == 0 && l.reserved == 0 && !l.queued && l.committing == nil:
		delete(s.lanes, l.name)
		l.removed = true
	}
}

// inFlight returns the lane of b when b is its batch in flight or the
// batch it released while b commits. s.mu must be held.
func (s *Lanes) inFlight(b *consumer.Batch) *laneQueue {
	if b == nil {
		return nil
	}
	l := s.lanes[b.Lane]
	if l == nil || (l.inFlight != b && l.committing != b) {
		return nil
	}
	return l
}

// done ends b's flight: b is l's batch in flight or its committing one.
// It returns the lane order of b's messages. s.mu must be held.
func (l *laneQueue) done(b *consumer.Batch) []uint64 {
	if l.committing == b {
		seqs := l.committingSeqs
		// l.after stays: it tells the source what inFlight came after.
		l.committing, l.committingSeqs, l.held = nil, nil, false
		return seqs
	}
	seqs := l.seqs
	l.inFlight, l.seqs, l.after = nil, nil, nil
	return seqs
}

// Release lets b's lane hand out its next batch while b, its batch in
// flight, commits: b is still to be settled (Settle, Finish), and until
// it is, the lane can have one more batch in flight, handed out after b's
// messages and before those of any batch after it. A source calls it once
// b's outcome is decided and being committed, when nothing b's commit
// leaves undone can change what the next batch may do (see
// sources/kafka's Source.AwaitPrevious). It returns false, and changes
// nothing, when b is not its lane's batch in flight or the lane has a
// batch committing already: a lane has at most two batches in flight.
func (s *Lanes) Release(b *consumer.Batch) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.inFlight(b)
	switch {
	case l == nil:
		return false
	case l.committing == b && l.held:
		l.held = false // released again, after Hold
	case l.inFlight != b || l.committing != nil:
		return false
	default:
		l.committing, l.committingSeqs = b, l.seqs
		l.inFlight, l.seqs, l.after = nil, nil, nil
	}
	s.update(l, time.Now())
	s.broadcast()
	return true
}

// Hold takes back Release for b, a batch that was released and runs
// again (its commit failed before it was settled): its lane hands nothing
// out until b is settled or released again. It returns false when b is
// not its lane's committing batch.
func (s *Lanes) Hold(b *consumer.Batch) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.inFlight(b)
	if l == nil || l.committing != b {
		return false
	}
	l.held = true
	s.update(l, time.Now())
	return true
}
