package consumer

import (
	"fmt"
	"slices"
	"sync"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
)

// The ordering of a sequenced strategy's messages, all of it in this file:
// a sender's messages apply in sequence order, so a message handed back for
// redelivery (it failed, or must itself wait) holds back every later
// message of its sender, in this batch and in later ones. Three parts:
//
//   - the gate decides, once per pass, which messages may run (admit), and
//     settles a handed-back message's followers as soon as it is handed
//     back (handBack), so the later stages never ask again;
//   - path.wait hands a message back to wait for an earlier one, or parks
//     it once it waited Config.GapMaxAttempts deliveries; the claim uses it
//     too, for a strategy's verdict that an earlier sequence number has not
//     arrived (claim.go);
//   - senders remembers, between batches, which of a sender's sequence
//     numbers were handed back and have not settled since (the gate's
//     memory across deliveries), fed by the batch's settlement (settle.go).

// gate is the ordering decision of one pass over a batch.
type gate struct {
	c *Consumer
	// bySender lists a sequenced strategy's messages per sender, in batch
	// order; nil for a strategy without sequences.
	bySender map[senderRef][]*item
}

// admit is the stage after keys: it settles the messages that cannot run
// in this pass (no usable key, a failure already decided in an earlier
// pass, an earlier message of the sender awaiting redelivery) and returns
// the rest in batch order, with the gate that keeps the order while they
// run.
func (c *Consumer) admit(items []*item) ([]*item, *gate) {
	g := &gate{c: c}
	if c.sequenced {
		g.bySender = map[senderRef][]*item{}
		for _, it := range items {
			if it.keyErr == nil && it.key.Sender != "" {
				sr := senderRef{it.key.Scope, it.key.Sender}
				g.bySender[sr] = append(g.bySender[sr], it)
			}
		}
	}
	var back []*item
	for _, it := range items {
		switch {
		case it.keyErr != nil:
			it.park(parked.ReasonInvalidKey, it.keyErr, false)
		case it.failed != nil && !it.failedPark:
			it.retry(it.failed, c.retryDelay(it))
			back = append(back, it)
		}
	}
	for _, it := range back {
		g.handBack(it)
	}
	// Sequence numbers of this batch that go to the claim ahead of a given
	// message: one of them awaiting redelivery since an earlier batch does
	// not hold the message back, since it is here and goes first.
	ahead := map[senderRef]map[int64]bool{}
	var run []*item
	for _, it := range items {
		if it.outcome != 0 {
			continue
		}
		if g.bySender != nil && it.key.Sender != "" {
			sr := senderRef{it.key.Scope, it.key.Sender}
			if c.senders.behind(it.key, ahead[sr]) {
				g.wait(it, "an earlier message of its sender is waiting for a retry")
				continue
			}
			if ahead[sr] == nil {
				ahead[sr] = map[int64]bool{}
			}
			ahead[sr][it.key.Seq] = true
		}
		run = append(run, it)
	}
	// A message handed back above may have held back one admitted before it.
	return pending(run), g
}

// handBack records that it goes back for redelivery: its sender's later
// messages of the batch that have not settled wait for it, even behind a
// copy of it.
func (g *gate) handBack(it *item) {
	if g.bySender == nil || it.keyErr != nil || it.key.Sender == "" {
		return
	}
	for _, o := range g.bySender[senderRef{it.key.Scope, it.key.Sender}] {
		if o.outcome == 0 && o.key.Seq > it.key.Seq {
			g.wait(o, "an earlier message of its sender is waiting for a retry")
		}
	}
}

// wait hands a message back to wait for an earlier one (see
// Consumer.wait); waiting, it holds its own followers back too.
func (g *gate) wait(it *item, why string) {
	if g.c.wait(it, why) {
		g.handBack(it)
	}
}

// wait hands a message back to wait for an earlier one and reports true,
// or parks it with reason gap when it has waited Config.GapMaxAttempts
// deliveries.
func (p *path) wait(it *item, why string) bool {
	if it.attempt() >= p.cfg.GapMaxAttempts {
		it.park(parked.ReasonGap, fmt.Errorf("sequence gap: %s waited %d deliveries: %s", it.key, it.attempt(), why), false)
		return false
	}
	it.retry(nil, p.cfg.GapDelay)
	it.waiting = true
	return true
}

// pending returns the items of group that have no outcome yet.
func pending(group []*item) []*item {
	if !slices.ContainsFunc(group, func(it *item) bool { return it.outcome != 0 }) {
		return group
	}
	out := group[:0:0]
	for _, it := range group {
		if it.outcome == 0 {
			out = append(out, it)
		}
	}
	return out
}

type senderRef struct{ scope, sender string }

// senders keeps, in memory, for a sequenced strategy, every sequence number
// of each sender that was handed back for a retry (failed or waiting) and
// has not settled since: a later sequence number of that sender must wait
// for all of them, or a monotonic mark would pass them by. Once a sequence
// number settled (applied, duplicate or parked), every copy of it and below
// is done: the highest settled one (done) makes older entries moot, so a
// copy handed back after another copy applied holds nothing back.
type senders struct {
	mu      sync.Mutex
	pending map[senderRef]map[int64]struct{} // sender → seqs awaiting redelivery
	done    map[senderRef]int64              // sender → highest seq settled
}

func newSenders() *senders {
	return &senders{pending: map[senderRef]map[int64]struct{}{}, done: map[senderRef]int64{}}
}

// behind reports whether an earlier sequence number of k's sender awaits
// redelivery, other than those in here (delivered again, ahead of k).
func (s *senders) behind(k dedupe.Key, here map[int64]bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sr := senderRef{k.Scope, k.Sender}
	done := s.done[sr]
	for seq := range s.pending[sr] {
		if seq > done && seq < k.Seq && !here[seq] {
			return true
		}
	}
	return false
}

// settled records the committed outcome of a batch of a sequenced
// strategy.
func (s *senders) settled(items []*item) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range items {
		if it.keyErr != nil || it.key.Sender == "" {
			continue
		}
		sr := senderRef{it.key.Scope, it.key.Sender}
		seqs := s.pending[sr]
		if it.outcome == OutcomeRetried {
			if it.key.Seq <= s.done[sr] {
				continue // another copy settled: this one will be a duplicate
			}
			if seqs == nil {
				seqs = map[int64]struct{}{}
				s.pending[sr] = seqs
			}
			seqs[it.key.Seq] = struct{}{}
			continue
		}
		if it.key.Seq > s.done[sr] {
			if len(s.done) > maxTracked {
				s.done = map[senderRef]int64{}
			}
			s.done[sr] = it.key.Seq
		}
		for seq := range seqs {
			if seq <= s.done[sr] {
				delete(seqs, seq)
			}
		}
		if len(seqs) == 0 {
			delete(s.pending, sr)
		}
	}
}
