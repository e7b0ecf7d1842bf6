package consumer

import "sync"

// maxTracked bounds the consumer's in-memory maps of messages and senders;
// past it a map starts afresh, which only makes waiting messages count as
// failing a little sooner, or a sender's handed-back sequence numbers be
// forgotten as a restart forgets them.
const maxTracked = 100_000

// attempts keeps, in memory, how many deliveries of each message were
// spent waiting (on a sequence gap, behind an earlier message of its
// sender, or in a batch that rolled back as a whole) rather than failing,
// so that waiting does not use up its attempts (Config.MaxAttempts).
type attempts struct {
	mu     sync.Mutex
	waited map[string]int // message → deliveries spent waiting
}

func newAttempts() *attempts { return &attempts{waited: map[string]int{}} }

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
func (a *attempts) failures(m *Message) int {
	if m.Attempt <= 1 {
		return 1 // a first delivery has waited for nothing
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.waited) == 0 {
		return m.Attempt
	}
	n := m.Attempt - a.waited[msgRef(m)]
	return max(n, 1)
}

// settled records the committed outcome of a batch: a message handed back
// to wait (or on a transient error) spent a delivery waiting; one settled
// is forgotten.
func (a *attempts) settled(items []*item) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.waited) > maxTracked {
		a.waited = map[string]int{}
	}
	for _, it := range items {
		if it.outcome == OutcomeRetried && (it.waiting || IsTransient(it.err)) {
			a.waited[msgRef(it.m)]++
		} else if it.outcome != OutcomeRetried && len(a.waited) > 0 {
			delete(a.waited, msgRef(it.m))
		}
	}
}

// abandoned records that a rolled-back batch's messages will be delivered
// again through no fault of their own.
func (a *attempts) abandoned(items []*item) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.waited) > maxTracked {
		a.waited = map[string]int{}
	}
	for _, it := range items {
		a.waited[msgRef(it.m)]++
	}
}
