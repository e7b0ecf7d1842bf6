package consumer

import (
	"sync"

	"github.com/effectively-once/effectively/dedupe"
)

// maxTracked bounds the waited map; past it the map starts afresh, which
// only makes waiting messages count as failing a little sooner.
const maxTracked = 100_000

type senderRef struct{ scope, sender string }

// waits keeps, in memory, what the consumer must remember between
// deliveries of a message:
//
//   - how many deliveries it spent waiting (on a sequence gap, behind an
//     earlier message of its sender, or in a batch that rolled back as a
//     whole) rather than failing, so that waiting does not use up its
//     attempts;
//   - for sequenced strategies, every sequence number of each sender that
//     was handed back for a retry (failed or waiting) and has not settled
//     since: a later sequence number of that sender must wait for all of
//     them, or a monotonic mark would pass them by. Once a sequence number
//     settled (applied, duplicate or parked), every copy of it and below is
//     done: the highest settled one (done) makes older entries moot, so a
//     copy handed back after another copy applied holds nothing back.
type waits struct {
	mu      sync.Mutex
	waited  map[string]int                   // message → deliveries spent waiting
	pending map[senderRef]map[int64]struct{} // sender → seqs awaiting redelivery
	done    map[senderRef]int64              // sender → highest seq settled
}

func newWaits() *waits {
	return &waits{waited: map[string]int{}, pending: map[senderRef]map[int64]struct{}{}, done: map[senderRef]int64{}}
}

// msgRef identifies a stored message across redeliveries; its lane may
// change (an SQS standard queue's receiver), its Ref does not. A Ref can
// recur (a topic deleted and created again restarts its offsets), so the
// dedupe key and payload fingerprint, which the consumer derives before it
// asks, tell apart two messages that share one: otherwise the waits of one
// would be subtracted from the attempts of the other, which then never
// runs out of them.
func msgRef(m *Message) string {
	k := m.DedupeKey
	return m.Source + "\x00" + m.Ref + "\x00" + k.String() + "\x00" + string(k.Fingerprint)
}

// failures returns how many of m's deliveries (this one included) were
// actual attempts, not waits.
func (w *waits) failures(m *Message) int {
	if m.Attempt <= 1 {
		return 1 // a first delivery has waited for nothing
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.waited) == 0 {
		return m.Attempt
	}
	n := m.Attempt - w.waited[msgRef(m)]
	return max(n, 1)
}

// behind reports whether an earlier sequence number of k's sender awaits
// redelivery, other than those in here (delivered again, ahead of k).
func (w *waits) behind(k dedupe.Key, here map[int64]bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	sr := senderRef{k.Scope, k.Sender}
	done := w.done[sr]
	for seq := range w.pending[sr] {
		if seq > done && seq < k.Seq && !here[seq] {
			return true
		}
	}
	return false
}

// settled records the committed outcome of a batch.
func (w *waits) settled(items []*item, sequenced bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.waited) > maxTracked {
		w.waited = map[string]int{}
	}
	for _, it := range items {
		if it.outcome == OutcomeRetried && (it.waiting || IsTransient(it.err)) {
			w.waited[msgRef(it.m)]++
		} else if it.outcome != OutcomeRetried && len(w.waited) > 0 {
			delete(w.waited, msgRef(it.m))
		}
		if !sequenced || it.keyErr != nil || it.key.Sender == "" {
			continue
		}
		sr := senderRef{it.key.Scope, it.key.Sender}
		seqs := w.pending[sr]
		if it.outcome == OutcomeRetried {
			if it.key.Seq <= w.done[sr] {
				continue // another copy settled: this one will be a duplicate
			}
			if seqs == nil {
				seqs = map[int64]struct{}{}
				w.pending[sr] = seqs
			}
			seqs[it.key.Seq] = struct{}{}
			continue
		}
		if it.key.Seq > w.done[sr] {
			if len(w.done) > maxTracked {
				w.done = map[senderRef]int64{}
			}
			w.done[sr] = it.key.Seq
		}
		for seq := range seqs {
			if seq <= w.done[sr] {
				delete(seqs, seq)
			}
		}
		if len(seqs) == 0 {
			delete(w.pending, sr)
		}
	}
}

// abandoned records that a rolled-back batch's messages will be delivered
// again through no fault of their own.
func (w *waits) abandoned(items []*item) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.waited) > maxTracked {
		w.waited = map[string]int{}
	}
	for _, it := range items {
		w.waited[msgRef(it.m)]++
	}
}
