package consumer

import (
	"sync"

	"github.com/effectively-once/effectively/dedupe"
)

// maxTracked bounds the waits map; past it the map starts afresh, which only
// makes waiting messages count as failing a little sooner.
const maxTracked = 100_000

type senderRef struct{ scope, sender string }

// waits keeps, in memory, what the consumer must remember between
// deliveries of a message: how many deliveries it spent waiting (on a
// sequence gap, behind an earlier message of its sender, or in a batch
// that rolled back as a whole) rather than failing, and, for sequenced strategies, which senders have a message
// waiting for a retry.
type waits struct {
	mu      sync.Mutex
	waited  map[string]int      // message → deliveries spent waiting
	blocked map[senderRef]int64 // sender → lowest seq waiting for a retry
}

func newWaits() *waits {
	return &waits{waited: map[string]int{}, blocked: map[senderRef]int64{}}
}

// msgRef identifies a stored message across redeliveries; its lane may
// change (an SQS standard queue's receiver), its Ref does not.
func msgRef(m *Message) string { return m.Source + "\x00" + m.Ref }

// failures returns how many of m's deliveries (this one included) were
// actual attempts, not waits.
func (w *waits) failures(m *Message) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := m.Attempt - w.waited[msgRef(m)]
	return max(n, 1)
}

// blockedAt returns the seq of the sender's message waiting for a retry.
func (w *waits) blockedAt(k dedupe.Key) (int64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	seq, ok := w.blocked[senderRef{k.Scope, k.Sender}]
	return seq, ok
}

// settled records the committed outcome of a batch.
func (w *waits) settled(items []*item, sequenced bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.waited) > maxTracked {
		w.waited = map[string]int{}
	}
	for _, it := range items {
		ref := msgRef(it.m)
		switch {
		case it.outcome == OutcomeRetried && it.waiting:
			w.waited[ref]++
		case it.outcome == OutcomeRetried:
			if sequenced && it.keyErr == nil && it.key.Sender != "" {
				sr := senderRef{it.key.Scope, it.key.Sender}
				if seq, ok := w.blocked[sr]; !ok || it.key.Seq < seq {
					w.blocked[sr] = it.key.Seq
				}
			}
		default:
			delete(w.waited, ref)
			if sequenced && it.keyErr == nil && it.key.Sender != "" {
				sr := senderRef{it.key.Scope, it.key.Sender}
				if seq, ok := w.blocked[sr]; ok && seq == it.key.Seq {
					delete(w.blocked, sr)
				}
			}
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
