package webhook

import (
	"container/list"
	"sync"
)

// attempts counts, per event ID, the deliveries handed to the consumer that
// have not ended in an acknowledgement, so that Message.Attempt grows
// across a provider's redeliveries. It holds at most max events: past
// that, the one seen least recently is forgotten (its next delivery counts
// from 1 again).
type attempts struct {
	mu    sync.Mutex
	max   int
	byID  map[string]*list.Element
	order list.List // of *attemptEntry, most recently seen first
}

type attemptEntry struct {
	id string
	n  int
}

func newAttempts(max int) *attempts {
	a := &attempts{max: max, byID: map[string]*list.Element{}}
	a.order.Init()
	return a
}

// next counts one more delivery of id and returns its number, from 1.
func (a *attempts) next(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if el, ok := a.byID[id]; ok {
		e := el.Value.(*attemptEntry)
		e.n++
		a.order.MoveToFront(el)
		return e.n
	}
	a.byID[id] = a.order.PushFront(&attemptEntry{id: id, n: 1})
	for a.order.Len() > a.max {
		old := a.order.Back()
		delete(a.byID, old.Value.(*attemptEntry).id)
		a.order.Remove(old)
	}
	return 1
}

// undo takes back a delivery of id that never reached a handler.
func (a *attempts) undo(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if el, ok := a.byID[id]; ok {
		e := el.Value.(*attemptEntry)
		if e.n--; e.n <= 0 {
			delete(a.byID, id)
			a.order.Remove(el)
		}
	}
}

// forget drops id once one of its deliveries was acknowledged.
func (a *attempts) forget(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if el, ok := a.byID[id]; ok {
		delete(a.byID, id)
		a.order.Remove(el)
	}
}

// len returns the number of events tracked.
func (a *attempts) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.byID)
}
