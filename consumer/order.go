package consumer

import (
	"fmt"
	"slices"

	"github.com/effectively-once/effectively/consumer/parked"
)

// The ordering gate: for a sequenced strategy, a sender's messages apply in
// sequence order, so a message handed back for redelivery (it failed, or
// must itself wait) holds back every later message of its sender. The gate
// is the one place that decides it: admit decides, once per pass, which
// messages may run; handBack settles a handed-back message's followers as
// soon as it is handed back, so the later stages never ask again.

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
			if c.waits.behind(it.key, ahead[sr]) {
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
