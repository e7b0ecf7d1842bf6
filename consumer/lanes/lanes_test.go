package lanes

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
)

func laneMsgs(lane string, n int) []*consumer.Message {
	out := make([]*consumer.Message, n)
	for i := range out {
		out[i] = &consumer.Message{Lane: lane, ID: fmt.Sprintf("%s/%d", lane, i), Attempt: 1}
	}
	return out
}

func ids(ms []*consumer.Message) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

func mustNext(t *testing.T, s *Lanes, limit int) *consumer.Batch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := s.Next(ctx, limit)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return b
}

func wantIDs(t *testing.T, b *consumer.Batch, want ...string) {
	t.Helper()
	if got := ids(b.Messages); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("batch of %s = %v, want %v", b.Lane, got, want)
	}
}

func TestLanesOrderAndExclusiveLane(t *testing.T) {
	s := New(Config{})
	s.Open("a", "data-a")
	s.Open("b", nil)
	a := laneMsgs("a", 5)
	s.Add("a", a...)
	b1 := mustNext(t, s, 3)
	wantIDs(t, b1, "a/0", "a/1", "a/2")
	if b1.SourceData != "data-a" {
		t.Fatalf("SourceData = %v, want the lane's data", b1.SourceData)
	}
	// Lane a has two more messages but is in flight: Next must hand out b.
	s.Add("b", laneMsgs("b", 1)...)
	b2 := mustNext(t, s, 3)
	wantIDs(t, b2, "b/0")
	// Both lanes in flight at once; nothing else to hand out.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Next(ctx, 3); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next with both lanes in flight = %v, want ctx's error", err)
	}
	if !s.Settle(b1, b1.Messages, nil) {
		t.Fatal("Settle of the batch in flight = false")
	}
	if s.Settle(b1, b1.Messages, nil) {
		t.Fatal("second Settle of a batch = true, want false")
	}
	wantIDs(t, mustNext(t, s, 3), "a/3", "a/4")
}

func TestLanesWakesOnAdd(t *testing.T) {
	s := New(Config{})
	s.Open("a", nil)
	got := make(chan *consumer.Batch)
	go func() {
		b, err := s.Next(context.Background(), 10)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	s.Add("a", laneMsgs("a", 2)...)
	wantIDs(t, <-got, "a/0", "a/1")
}

func TestLanesRedelivery(t *testing.T) {
	s := New(Config{})
	s.Open("a", nil)
	m := laneMsgs("a", 6)
	s.Add("a", m...)
	b := mustNext(t, s, 4)
	const delay = 50 * time.Millisecond
	settled := time.Now()
	// m0 acked, m1 retried later, m3 and m2 retried at once (given out of
	// order), nothing abandoned.
	s.Settle(b, m[:1], []consumer.Retry{{Message: m[1], Delay: delay}, {Message: m[3]}, {Message: m[2]}})
	// Due ones first, in lane order, then undelivered ones; m1 still waits.
	b = mustNext(t, s, 3)
	wantIDs(t, b, "a/2", "a/3", "a/4")
	if a := b.Messages; a[0].Attempt != 2 || a[1].Attempt != 2 || a[2].Attempt != 1 {
		t.Fatalf("attempts = %d %d %d, want 2 2 1", a[0].Attempt, a[1].Attempt, a[2].Attempt)
	}
	if m[2].Attempt != 1 || b.Messages[0] == m[2] {
		t.Fatal("a redelivery changed the message handed back; want a copy")
	}
	// m4 abandoned (neither acked nor retried): due at once.
	s.Settle(b, b.Messages[:2], nil)
	b = mustNext(t, s, 1)
	wantIDs(t, b, "a/4")
	s.Settle(b, b.Messages, nil)
	b = mustNext(t, s, 1)
	wantIDs(t, b, "a/5")
	s.Settle(b, b.Messages, nil)
	// Only m1 is left: Next waits for its delay.
	b = mustNext(t, s, 10)
	wantIDs(t, b, "a/1")
	if waited := time.Since(settled); waited < delay {
		t.Fatalf("retried message handed out after %s, before its delay %s", waited, delay)
	}
	if b.Messages[0].Attempt != 2 {
		t.Fatalf("Attempt = %d, want 2", b.Messages[0].Attempt)
	}
	s.Settle(b, b.Messages, nil)
	if !s.Idle() {
		t.Fatal("not idle after everything was acknowledged")
	}
}

func TestLanesRetryBeforeUndelivered(t *testing.T) {
	s := New(Config{})
	s.Open("a", nil)
	m := laneMsgs("a", 4)
	s.Add("a", m[:2]...)
	b := mustNext(t, s, 2)
	s.Settle(b, m[:1], []consumer.Retry{{Message: m[1]}})
	s.Add("a", m[2:]...)
	wantIDs(t, mustNext(t, s, 10), "a/1", "a/2", "a/3")
}

func TestLanesBackpressure(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	ctx := context.Background()

	s := New(Config{LaneBuffer: 2, Buffer: 3})
	s.Open("a", nil)
	s.Open("b", nil)
	if n, err := s.Reserve(ctx, "a", 5); n != 2 || err != nil {
		t.Fatalf("Reserve(a, 5) = %d, %v; want 2 (the lane's bound)", n, err)
	}
	s.Add("a", laneMsgs("a", 2)...)
	s.Unreserve("a", 2)
	if _, err := s.Reserve(cancelled, "a", 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reserve of a full lane = %v, want it to block until ctx is done", err)
	}
	if n, err := s.Reserve(ctx, "b", 5); n != 1 || err != nil {
		t.Fatalf("Reserve(b, 5) = %d, %v; want 1 (the total bound)", n, err)
	}
	s.Unreserve("b", 1)

	// A blocked Reserve returns once Next takes a message of the lane.
	got := make(chan int)
	go func() {
		n, err := s.Reserve(ctx, "a", 5)
		if err != nil {
			t.Error(err)
		}
		got <- n
	}()
	b := mustNext(t, s, 1)
	wantIDs(t, b, "a/0")
	if n := <-got; n != 1 {
		t.Fatalf("Reserve after one message was taken = %d, want 1", n)
	}
	// Retries do not count: settling b with a retry leaves the room as is.
	s.Settle(b, nil, []consumer.Retry{{Message: b.Messages[0]}})
	if _, err := s.Reserve(cancelled, "a", 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reserve of a full lane = %v, want it to block", err)
	}

	// A stopped lane refuses reservations, and wakes those waiting.
	errc := make(chan error)
	go func() {
		_, err := s.Reserve(ctx, "a", 1)
		errc <- err
	}()
	s.Stop("a")
	if err := <-errc; !errors.Is(err, ErrStopped) {
		t.Fatalf("Reserve of a stopped lane = %v, want ErrStopped", err)
	}
	if s.Add("a", laneMsgs("a", 1)...) {
		t.Fatal("Add to a stopped lane = true")
	}
}

func TestLanesFairness(t *testing.T) {
	s := New(Config{})
	for _, n := range []string{"a", "b", "c"} {
		s.Open(n, nil)
	}
	s.Add("a", laneMsgs("a", 100)...)
	s.Add("b", laneMsgs("b", 1)...)
	s.Add("c", laneMsgs("c", 1)...)
	var order []string
	for range 4 {
		b := mustNext(t, s, 1)
		order = append(order, b.Lane)
		s.Settle(b, b.Messages, nil)
	}
	if fmt.Sprint(order) != "[a b c a]" {
		t.Fatalf("lanes served %v, want [a b c a]: a backlog must not starve the others", order)
	}
}

func TestLanesAutoLanesAndFinish(t *testing.T) {
	s := New(Config{AutoLanes: true})
	m := laneMsgs("g", 3)
	s.Add("g", m...)
	b := mustNext(t, s, 1)
	wantIDs(t, b, "g/0")
	ok, dropped := s.Finish(b, true)
	if !ok || fmt.Sprint(ids(dropped)) != "[g/1 g/2]" {
		t.Fatalf("Finish(drop) = %v, %v; want true, [g/1 g/2]", ok, ids(dropped))
	}
	if st := s.Lane("g"); st.Exists {
		t.Fatalf("an idle auto lane is still there: %+v", st)
	}
	if ok, _ := s.Finish(b, false); ok {
		t.Fatal("Finish of a finished batch = true")
	}
	if !s.Idle() {
		t.Fatal("not idle")
	}
}

func TestLanesResetRemoveClose(t *testing.T) {
	s := New(Config{})
	s.Open("a", nil)
	m := laneMsgs("a", 3)
	s.Add("a", m...)
	b := mustNext(t, s, 1)
	s.Reset("a", nil, m) // a crash: everything again, b forgotten
	if s.Settle(b, b.Messages, nil) {
		t.Fatal("Settle of a batch forgotten by Reset = true")
	}
	b = mustNext(t, s, 10)
	wantIDs(t, b, "a/0", "a/1", "a/2")
	s.Settle(b, m[:1], []consumer.Retry{{Message: m[2], Delay: time.Hour}})
	if st := s.Lane("a"); fmt.Sprint(ids(st.Retries)) != "[a/1 a/2]" || st.InFlight != nil {
		t.Fatalf("lane state %v, want retries [a/1 a/2] and nothing in flight", ids(st.Retries))
	}
	s.Add("a", laneMsgs("x", 1)...)
	b = mustNext(t, s, 10)
	wantIDs(t, b, "a/1", "x/0")
	inFlight, retries := s.Remove("a")
	if inFlight != b || fmt.Sprint(ids(retries)) != "[a/2]" {
		t.Fatalf("Remove = %v, %v", inFlight, ids(retries))
	}
	if s.Settle(b, b.Messages, nil) {
		t.Fatal("Settle of a removed lane's batch = true")
	}

	s.Open("b", nil)
	s.Add("b", laneMsgs("b", 2)...)
	errc := make(chan error)
	go func() {
		_, err := s.Next(context.Background(), 10)
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	s.Open("c", nil)
	s.Add("c", laneMsgs("c", 2)...)
	if left := s.Close(); fmt.Sprint(ids(left)) != "[c/0 c/1]" {
		t.Fatalf("Close returned %v, want [c/0 c/1]", ids(left))
	}
	if _, err := s.Next(context.Background(), 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close = %v", err)
	}
	if s.Add("c", laneMsgs("c", 1)...) {
		t.Fatal("Add after Close = true")
	}
}

func TestLanesSetError(t *testing.T) {
	s := New(Config{})
	boom := errors.New("boom")
	errc := make(chan error)
	go func() {
		_, err := s.Next(context.Background(), 1)
		errc <- err
	}()
	s.SetError(boom)
	if err := <-errc; !errors.Is(err, boom) {
		t.Fatalf("Next = %v, want the error set", err)
	}
	s.Open("a", nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Next(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next with a lane open = %v, want it to wait", err)
	}
}

// TestLanesConcurrent runs fetchers on real goroutines against a producer
// bounded by the buffer, retrying some messages, and checks that no lane
// is ever in flight twice, that every lane's first deliveries come in lane
// order, and that everything is acknowledged in the end.
func TestLanesConcurrent(t *testing.T) {
	const lanes, perLane, fetchers = 6, 300, 4
	s := New(Config{LaneBuffer: 8, Buffer: 24})
	names := make([]string, lanes)
	for i := range names {
		names[i] = fmt.Sprintf("l%d", i)
		s.Open(names[i], nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var producers sync.WaitGroup
	for _, name := range names {
		producers.Add(1)
		go func() {
			defer producers.Done()
			ms := laneMsgs(name, perLane)
			for len(ms) > 0 {
				n, err := s.Reserve(ctx, name, 5)
				if err != nil {
					t.Error(err)
					return
				}
				n = min(n, len(ms))
				s.Add(name, ms[:n]...)
				s.Unreserve(name, n)
				ms = ms[n:]
			}
		}()
	}

	var busy [lanes]atomic.Bool
	var mu sync.Mutex
	firstSeen := map[string]int{} // lane → next index expected at a first delivery
	acked := 0
	done := make(chan struct{})
	var fetchersWG sync.WaitGroup
	for f := range fetchers {
		fetchersWG.Add(1)
		go func() {
			defer fetchersWG.Done()
			for n := 0; ; n++ {
				b, err := s.Next(ctx, 7)
				if err != nil {
					if !errors.Is(err, ErrClosed) {
						t.Error(err)
					}
					return
				}
				var li int
				fmt.Sscanf(b.Lane, "l%d", &li)
				if busy[li].Swap(true) {
					t.Errorf("lane %s handed out twice at once", b.Lane)
				}
				var ack []*consumer.Message
				var retry []consumer.Retry
				mu.Lock()
				for i, m := range b.Messages {
					var idx int
					fmt.Sscanf(m.ID[len(b.Lane)+1:], "%d", &idx)
					if m.Attempt == 1 {
						if idx != firstSeen[b.Lane] {
							t.Errorf("lane %s: first delivery of %d, want %d", b.Lane, idx, firstSeen[b.Lane])
						}
						firstSeen[b.Lane] = idx + 1
					}
					if m.Attempt == 1 && (idx+f+n+i)%5 == 0 {
						retry = append(retry, consumer.Retry{Message: m, Delay: time.Millisecond})
					} else {
						ack = append(ack, m)
					}
				}
				acked += len(ack)
				all := acked == lanes*perLane
				mu.Unlock()
				busy[li].Store(false)
				s.Settle(b, ack, retry)
				if all {
					close(done)
				}
			}
		}()
	}
	producers.Wait()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("not everything was acknowledged")
	}
	s.Close()
	fetchersWG.Wait()
	if !s.Idle() {
		t.Fatal("not idle at the end")
	}
}

// TestLanesAbandonedBeforeUndeliveredToAWaitingNext: a batch abandoned
// while another Next is on its way to the lock is handed out again, at
// once, before the lane's undelivered messages. Next must judge what is
// due at the moment it holds the lock: judged by a clock read before it
// waited for the lock, the abandoned messages (due at the moment of their
// Settle, later) looked not yet due, and the lane's undelivered messages
// went out ahead of them, so that a sequenced sender's later message
// applied before an earlier one that was abandoned and a monotonic mark
// passed the earlier one by: a lost message. The test holds the lock
// while Next waits for it, and settles the batch then.
func TestLanesAbandonedBeforeUndeliveredToAWaitingNext(t *testing.T) {
	s := New(Config{})
	s.Open("a", nil)
	s.Add("a", laneMsgs("a", 4)...)
	b := mustNext(t, s, 2)
	wantIDs(t, b, "a/0", "a/1")

	s.mu.Lock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		b   *consumer.Batch
		err error
	}
	next := make(chan result, 1)
	go func() {
		b, err := s.Next(ctx, 2)
		next <- result{b, err}
	}()
	if err := waitForLockWaiter("(*Lanes).Next"); err != nil {
		s.mu.Unlock()
		t.Fatal(err)
	}
	// Abandoned: neither acknowledged nor retried.
	if !s.settleLocked(b, nil, nil) {
		s.mu.Unlock()
		t.Fatal("the batch in flight could not be settled")
	}
	s.mu.Unlock()
	r := <-next
	if r.err != nil {
		t.Fatalf("Next: %v", r.err)
	}
	wantIDs(t, r.b, "a/0", "a/1")
}

// waitForLockWaiter waits until a goroutine running fn is blocked on a
// sync.Mutex (the Lanes lock the caller holds).
func waitForLockWaiter(fn string) error {
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			header, _, _ := strings.Cut(g, "\n")
			if strings.Contains(header, "[sync.Mutex.Lock") && strings.Contains(g, fn) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no goroutine in %s is waiting for the lock", fn)
		}
		runtime.Gosched()
	}
}
