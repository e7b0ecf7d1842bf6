package lanes

import (
	"cmp"
	"slices"
	"time"

	"github.com/effectively-once/effectively/consumer"
)

// Settle ends b's flight and frees its lane: the messages in retry are
// handed out again after their delay, those neither in ack nor in retry
// (abandoned) at once, both before the lane's undelivered messages and in
// lane order. The messages are known by their position in b: a source may
// put copies in b.Messages before handing b on (a fresh copy per
// delivery). It returns false, and changes nothing, when b is not its
// lane's batch in flight (settled already, or its lane was removed or
// reset).
func (s *Lanes) Settle(b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settleLocked(b, ack, retry)
}

// settleLocked is Settle with s.mu held.
func (s *Lanes) settleLocked(b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) bool {
	l := s.inFlight(b)
	if l == nil {
		return false
	}
	now := time.Now()
	done := make(map[*consumer.Message]bool, len(ack)+len(retry))
	for _, m := range ack {
		done[m] = true
	}
	pos := make(map[*consumer.Message]int, len(b.Messages))
	for i, m := range b.Messages {
		pos[m] = i
	}
	seqs := l.done(b)
	for _, r := range retry {
		i, ok := pos[r.Message]
		if !ok || done[r.Message] {
			continue
		}
		done[r.Message] = true
		l.retries = append(l.retries, laneSlot{seq: seqs[i], m: r.Message, due: now.Add(r.Delay)})
	}
	for i, m := range b.Messages {
		if !done[m] {
			done[m] = true
			l.retries = append(l.retries, laneSlot{seq: seqs[i], m: m, due: now})
		}
	}
	slices.SortFunc(l.retries, bySeq)
	s.update(l, now)
	s.broadcast()
	return true
}

// Finish ends b's flight and frees its lane without redelivering anything
// itself, for a source whose broker redelivers what was not acknowledged
// (SQS, once a visibility timeout runs out). With drop, the lane's
// undelivered messages are dropped too and returned, in lane order, for
// the source to hand back to its broker (an SQS FIFO group must be
// delivered again from the message that failed). It returns false when b
// is not its lane's batch in flight.
func (s *Lanes) Finish(b *consumer.Batch, drop bool) (ok bool, dropped []*consumer.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.inFlight(b)
	if l == nil {
		return false, nil
	}
	l.done(b)
	if drop {
		for _, f := range l.fresh {
			dropped = append(dropped, f.m)
		}
		s.fresh -= len(l.fresh)
		l.fresh = nil
	}
	s.update(l, time.Now())
	s.broadcast()
	return true, dropped
}

// Reset starts a lane over, as a broker does after a consumer crashed:
// its batch in flight is forgotten (settling it returns false), and what
// it held is replaced by msgs, delivered in this order as undelivered
// messages. With a non-nil b, Reset does nothing and returns false unless
// b is the lane's batch in flight.
func (s *Lanes) Reset(name string, b *consumer.Batch, msgs []*consumer.Message) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.lanes[name]
	if l == nil || (b != nil && l.inFlight != b) {
		return false
	}
	s.fresh -= len(l.fresh)
	l.fresh, l.retries, l.inFlight, l.seqs = l.fresh[:0], nil, nil, nil
	l.committing, l.committingSeqs = nil, nil
	s.appendFresh(l, msgs)
	return true
}

// State is what Lanes.Lane reports of a lane.
type State struct {
	// Exists is false for a lane that is not there.
	Exists bool
	// Stopped: Next no longer hands the lane out.
	Stopped bool
	// InFlight is the lane's batch in flight, or nil.
	InFlight *consumer.Batch
	// Committing is the batch that Release let go of the lane while it
	// commits, not yet settled, or nil.
	Committing *consumer.Batch
	// After is, for InFlight, the batch that was committing when it was
	// handed out (the batch before it in the lane, not settled then), or
	// nil.
	After *consumer.Batch
	// Held: Committing runs again (Hold), and the lane hands nothing out.
	Held bool
	// Buffered counts the messages added and not yet delivered.
	Buffered int
	// Retries are the messages handed back and waiting to be delivered
	// again, in lane order.
	Retries []*consumer.Message
}

// Lane reports the state of the lane name.
func (s *Lanes) Lane(name string) State {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.lanes[name]
	if l == nil {
		return State{}
	}
	st := State{Exists: true, Stopped: l.stopped, InFlight: l.inFlight, Committing: l.committing, After: l.after, Held: l.held, Buffered: len(l.fresh)}
	for _, r := range l.retries {
		st.Retries = append(st.Retries, r.m)
	}
	return st
}

// Idle reports whether no lane holds a message or has a batch in flight.
func (s *Lanes) Idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.lanes {
		if l.inFlight != nil || l.committing != nil || len(l.fresh) > 0 || len(l.retries) > 0 {
			return false
		}
	}
	return true
}

// Changed returns a channel that is closed at the next change (a message
// added, a batch handed out or settled, a lane opened, stopped or
// removed). Take it before looking at the state it guards.
func (s *Lanes) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiter()
}

// Close makes Next and Reserve return ErrClosed and Add refuse
// messages, and drops and returns every message not in flight (undelivered
// ones and those waiting for redelivery), lane by lane in lane order.
// Batches in flight can still be settled.
func (s *Lanes) Close() []*consumer.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var out []*consumer.Message
	for _, l := range s.lanes {
		held := append(slices.Clone(l.retries), l.fresh...)
		slices.SortFunc(held, bySeq)
		for _, h := range held {
			out = append(out, h.m)
		}
		s.fresh -= len(l.fresh)
		l.fresh, l.retries = nil, nil
	}
	s.ready = nil
	clear(s.waiting)
	s.broadcast()
	return out
}

// broadcast wakes every goroutine waiting for a change. s.mu must be held.
func (s *Lanes) broadcast() {
	if s.wake != nil {
		close(s.wake)
		s.wake = nil
	}
}

// waiter returns the channel that the next change closes, made when
// somebody first waits for it, so that changes nobody waits for (a
// producer adding message after message) cost nothing. s.mu must be held.
func (s *Lanes) waiter() chan struct{} {
	if s.wake == nil {
		s.wake = make(chan struct{})
	}
	return s.wake
}

func bySeq(a, b laneSlot) int { return cmp.Compare(a.seq, b.seq) }
