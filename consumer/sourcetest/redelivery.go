package sourcetest

import (
	"slices"
	"time"

	"github.com/effectively-once/effectively/consumer"
)

// retryDelay is the delay of the suite's retries: whole seconds, which
// every broker can honour (SQS rounds visibility timeouts up to seconds).
const retryDelay = time.Second

// attemptOf returns the Attempt of the latest delivery of t.
func (e *env) attemptOf(t string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lastMsg[t].attempt
}

// testRetryRedelivered: a retried message comes back once its delay is
// over, with the same Ref and ID and the next Attempt; the messages
// acknowledged with it do not; a source that holds its lane on a retry
// delivers nothing later of the lane first.
func testRetryRedelivered(e *env) {
	want := e.publishN(0, 3)
	target := want[1]
	var firstAttempt int
	var handedBack time.Time
	redelivered := false
	for !redelivered {
		b := e.fetch(10)
		var ack []*consumer.Message
		var retry []consumer.Retry
		for _, m := range b.Messages {
			switch {
			case tag(m) == target && handedBack.IsZero():
				firstAttempt = m.Attempt
				retry = append(retry, consumer.Retry{Message: m, Delay: retryDelay})
			case tag(m) == target:
				redelivered = true
				if waited := time.Since(handedBack); waited < retryDelay-10*time.Millisecond {
					e.Errorf("%s delivered again %s after it was handed back with a delay of %s", target, waited, retryDelay)
				}
				if m.Attempt != firstAttempt+1 && !e.h.Features.Duplicates {
					e.Errorf("%s redelivered with Attempt %d, after %d", target, m.Attempt, firstAttempt)
				}
				ack = append(ack, m)
			default:
				if e.h.Features.HoldsLaneOnRetry && !handedBack.IsZero() && !redelivered && tag(m) == want[2] {
					e.Errorf("%s delivered while %s, before it in its lane, waited out its retry (Features.HoldsLaneOnRetry)", tag(m), target)
				}
				ack = append(ack, m)
			}
		}
		start := time.Now()
		if err := e.settle(e.source(), b, ack, retry); err != nil {
			e.Errorf("Settle: %v", err)
		}
		if len(retry) > 0 {
			handedBack = start
		}
	}
	e.drain(10, want)
	e.mu.Lock()
	for _, t := range want {
		wantN := 1
		if t == target {
			wantN = 2
		}
		if n := e.seen[t]; n != wantN && !e.h.Features.Duplicates {
			e.Errorf("%s delivered %d times, want %d", t, n, wantN)
		}
	}
	e.mu.Unlock()
	e.expectQuiet(e.quietWait(), "every message was acknowledged")
}

// testDueRetryFirst: once a retried message is due, it is delivered before
// the messages of its lane that were not delivered yet.
func testDueRetryFirst(e *env) {
	if !e.ordered() {
		e.Skip("the source's lanes keep no order (Features.Unordered)")
	}
	want := e.publishN(0, 6)
	b := e.fetch(2)
	head := b.Messages[0]
	if tag(head) != want[0] {
		e.Fatalf("first delivery of the lane is %s, want %s", tag(head), want[0])
	}
	start := time.Now()
	if err := e.settle(e.source(), b, b.Messages[1:], []consumer.Retry{{Message: head, Delay: retryDelay}}); err != nil {
		e.Errorf("Settle: %v", err)
	}
	// What is checked here is the order once the retry is due, so the test
	// waits out the delay (and a little, for the source to have the later
	// messages at hand) before it fetches again.
	<-time.After(time.Until(start.Add(retryDelay + 300*time.Millisecond)))
	next := e.fetch(10)
	if got := tag(next.Messages[0]); got != want[0] {
		e.Errorf("once due, the retried %s must come before the lane's undelivered messages; the next batch is %v", want[0], tags(next.Messages))
	}
	e.ack(next)
	e.drain(10, want)
}

// testAbandoned: messages in neither list of Settle come back (at once, or
// after the broker's visibility timeout) with the same Ref and the next
// Attempt, before any message of their lane not delivered yet, in lane
// order; and so do those left over when only the first of a batch is
// acknowledged.
func testAbandoned(e *env) {
	want := e.publishN(0, 8)
	b := e.fetch(3)
	if err := e.settle(e.source(), b, nil, nil); err != nil {
		e.Errorf("Settle abandoning a batch: %v", err)
	}
	e.expectBack(tags(b.Messages), true)

	// Unordered lanes may have delivered everything by now.
	want = append(want, e.publishN(0, 3)...)
	b = e.fetch(3)
	if len(b.Messages) > 1 {
		rest := tags(b.Messages[1:])
		if err := e.settle(e.source(), b, b.Messages[:1], nil); err != nil {
			e.Errorf("Settle: %v", err)
		}
		e.expectBack(rest, true)
	} else {
		e.ack(b)
	}
	e.drain(10, want)
	e.expectQuiet(e.quietWait(), "every message was acknowledged")
}

// expectBack fetches until every message of back, just handed back, was
// delivered again, acknowledging everything, and checks their Attempt. For
// abandoned messages (due at once) of an ordered source it also checks that
// they came first, in lane order; a retried message may be overtaken by
// later ones of its lane while it waits out its delay.
func (e *env) expectBack(back []string, abandoned bool) {
	e.Helper()
	before := map[string]int{}
	for _, t := range back {
		before[t] = e.attemptOf(t)
	}
	left := slices.Clone(back)
	for len(left) > 0 {
		b := e.fetch(len(left))
		for _, m := range b.Messages {
			t := tag(m)
			i := slices.Index(left, t)
			if abandoned && e.ordered() && len(left) > 0 {
				switch {
				case i < 0:
					e.Errorf("%s delivered before the abandoned %v of its lane came back", t, left)
				case i > 0:
					e.Errorf("abandoned messages came back out of order: %s before %v", t, left[:i])
				}
			}
			if i >= 0 {
				left = slices.Delete(left, i, i+1)
				if m.Attempt != before[t]+1 && !e.h.Features.Duplicates {
					e.Errorf("%s delivered again with Attempt %d, after %d", t, m.Attempt, before[t])
				}
			}
		}
		e.ack(b)
	}
}

// testRestart: a new source (a restart after a crash) delivers what the
// old one had in flight, with the same Refs; settling the old batch
// afterwards returns nil.
func testRestart(e *env) {
	var want []string
	for lane := range e.h.Lanes {
		want = append(want, e.publishN(lane, 4)...)
	}
	b := e.fetch(10)
	inFlight := tags(b.Messages)
	old := e.restart()
	if err := e.settle(old, b, nil, nil); err != nil {
		e.Errorf("settling a batch of a closed source: %v, want nil (its lane is lost, its messages will be delivered again)", err)
	}
	got := e.drain(10, want)
	for _, t := range inFlight {
		i := slices.IndexFunc(got, func(m *consumer.Message) bool { return tag(m) == t })
		if i < 0 {
			e.Errorf("%s, in flight at the restart, was not delivered again", t)
			continue
		}
		if a := got[i].Attempt; e.h.Features.AttemptsSurviveRestart && a < 2 {
			e.Errorf("%s delivered again after a restart with Attempt %d; the broker counts deliveries (Features.AttemptsSurviveRestart)", t, a)
		}
	}
	e.expectQuiet(e.quietWait(), "every message was acknowledged")
}

// testLostLane: a batch whose lane was lost meanwhile settles with nil and
// has no effect: its messages come again, with the same Refs and the next
// Attempt, since the source counts on across the loss.
func testLostLane(e *env) {
	if e.b.LoseLanes == nil {
		e.Skip("the harness cannot make a source lose its lanes (Broker.LoseLanes)")
	}
	want := e.publishN(0, 4)
	b := e.fetch(10)
	src := e.source()
	e.b.LoseLanes(e.T, src)
	if err := e.settle(src, b, b.Messages, nil); err != nil {
		e.Errorf("settling a batch whose lane was lost: %v, want nil", err)
	}
	e.mu.Lock()
	for _, m := range b.Messages {
		delete(e.acked, tag(m)) // the acknowledgement had no effect
	}
	e.mu.Unlock()
	e.expectBack(tags(b.Messages), true)
	e.drain(10, want)
}
