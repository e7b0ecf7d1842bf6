package lanes

import (
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
)

// nextNow returns the batch Next hands out at once, or nil when it would
// wait (for a lane with undelivered messages, no retries).
func nextNow(t *testing.T, s *Lanes, limit int) *consumer.Batch {
	t.Helper()
	s.mu.Lock()
	ready := false
	for _, l := range s.ready {
		ready = ready || l.handable(time.Now())
	}
	s.mu.Unlock()
	if !ready {
		return nil
	}
	return mustNext(t, s, limit)
}

// TestReleaseHandsOutTheNextBatchInOrder: a released batch lets its lane
// hand out one more batch, of the messages after it, which reports the
// released one as After; no third batch while both are unsettled; when
// the released batch is abandoned and the one after it too, both come
// again in lane order.
func TestReleaseHandsOutTheNextBatchInOrder(t *testing.T) {
	s := New(Config{})
	s.Open("a", nil)
	s.Add("a", laneMsgs("a", 6)...)
	b1 := mustNext(t, s, 2)
	if nextNow(t, s, 2) != nil {
		t.Fatal("a second batch of a lane in flight before Release")
	}
	if !s.Release(b1) {
		t.Fatal("Release refused the lane's batch in flight")
	}
	b2 := nextNow(t, s, 2)
	if b2 == nil {
		t.Fatal("no batch after Release")
	}
	wantIDs(t, b2, "a/2", "a/3")
	if st := s.Lane("a"); st.Committing != b1 || st.InFlight != b2 || st.After != b1 {
		t.Fatalf("state %+v, want b1 committing, b2 in flight after it", st)
	}
	if s.Release(b2) {
		t.Fatal("Release of a second batch while one commits")
	}
	if nextNow(t, s, 2) != nil {
		t.Fatal("a third batch while two are unsettled")
	}
	// The batch after settles first (it was refused), then the released one.
	if !s.Settle(b2, nil, nil) || !s.Settle(b1, nil, nil) {
		t.Fatal("Settle refused a batch in flight")
	}
	b3 := mustNext(t, s, 10)
	wantIDs(t, b3, "a/0", "a/1", "a/2", "a/3", "a/4", "a/5")
	if b3.Messages[0].Attempt != 2 || b3.Messages[2].Attempt != 2 || b3.Messages[4].Attempt != 1 {
		t.Fatalf("attempts %d, %d, %d; want 2 for the two batches handed back, 1 for the rest",
			b3.Messages[0].Attempt, b3.Messages[2].Attempt, b3.Messages[4].Attempt)
	}
	if st := s.Lane("a"); st.After != nil || st.Committing != nil {
		t.Fatalf("state %+v, want nothing committing", st)
	}
}

// TestHoldStopsTheHandOut: a released batch held again (it runs another
// pass) keeps its lane from handing out until it is released again or
// settled.
func TestHoldStopsTheHandOut(t *testing.T) {
	s := New(Config{})
	s.Open("a", nil)
	s.Add("a", laneMsgs("a", 4)...)
	b1 := mustNext(t, s, 1)
	s.Release(b1)
	b2 := mustNext(t, s, 1)
	if !s.Hold(b1) {
		t.Fatal("Hold refused the committing batch")
	}
	s.Settle(b2, nil, nil)
	if nextNow(t, s, 1) != nil || !s.Lane("a").Held {
		t.Fatal("a batch handed out while the batch before it is held")
	}
	if !s.Release(b1) {
		t.Fatal("Release after Hold refused")
	}
	b3 := mustNext(t, s, 1)
	wantIDs(t, b3, "a/1")
	if st := s.Lane("a"); st.After != b1 {
		t.Fatalf("After = %v, want the batch released again", st.After)
	}
	s.Settle(b1, b1.Messages, nil)
	if st := s.Lane("a"); st.After != b1 || st.Committing != nil {
		t.Fatalf("state %+v: After must stay with the batch in flight after the one before it settled", st)
	}
}
