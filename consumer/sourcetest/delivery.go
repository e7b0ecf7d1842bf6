package sourcetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/effectively-once/effectively/consumer"
)

// testFetchBlocks: Fetch on an empty broker waits until its context is
// done and returns the context's error, never an empty batch; once there
// is a message, it returns it.
func testFetchBlocks(e *env) {
	b, err := e.tryFetch(context.Background(), 10, 300*time.Millisecond)
	if err == nil {
		e.Fatalf("Fetch returned %v from an empty broker", tags(b.Messages))
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		e.Errorf("Fetch on an empty broker until its deadline: %v, want the context's error", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		b, err := e.source().Fetch(ctx, 10)
		if err == nil {
			err = fmt.Errorf("returned %d messages from an empty broker", len(b.Messages))
		}
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			e.Errorf("Fetch with a cancelled context: %v, want context.Canceled", err)
		}
	case <-time.After(fetchGuard):
		e.Fatalf("Fetch did not return within %s of its context's cancellation", fetchGuard)
	}

	want := e.publishN(0, 1)
	got := e.drain(10, want)
	if len(got) != 1 || tag(got[0]) != want[0] {
		e.Errorf("delivered %v, want %v", tags(got), want)
	}
}

// testDeliversEverything: several fetchers at once receive every message
// once, in batches of at most the size asked for, of one lane each, each
// lane in order (all checked on every batch), at the first attempt; and
// nothing comes back once everything was acknowledged.
func testDeliversEverything(e *env) {
	const total, max, fetchers = 240, 7, 3
	var want []string
	for lane := range e.h.Lanes {
		want = append(want, e.publish(lane, someValues(e, lane, total/e.h.Lanes)...)...)
	}
	left := map[string]bool{}
	for _, t := range want {
		left[t] = true
	}
	var mu sync.Mutex
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range fetchers {
		wg.Go(func() {
			for ctx.Err() == nil {
				b, err := e.tryFetch(ctx, max, fetchGuard+e.h.RedeliveryDelay)
				if err != nil {
					if ctx.Err() == nil {
						e.Errorf("Fetch: %v", err)
						cancel()
					}
					return
				}
				mu.Lock()
				for _, m := range b.Messages {
					if m.Attempt != 1 && !e.h.Features.Duplicates {
						e.Errorf("%s: Attempt %d at its first delivery, want 1", tag(m), m.Attempt)
					}
					delete(left, tag(m))
				}
				finished := len(left) == 0
				mu.Unlock()
				if err := e.settle(e.source(), b, b.Messages, nil); err != nil {
					e.Errorf("Settle: %v", err)
				}
				if finished {
					cancel()
				}
			}
		})
	}
	wg.Wait()
	if len(left) > 0 {
		e.Fatalf("%d of %d messages were never delivered", len(left), len(want))
	}
	e.mu.Lock()
	for _, t := range want {
		if n := e.seen[t]; n != 1 && !e.h.Features.Duplicates {
			e.Errorf("%s delivered %d times, want once", t, n)
		}
	}
	e.mu.Unlock()
	e.expectQuiet(e.quietWait(), "every message was acknowledged")
}

// someValues returns n values for lane: text, and some binary ones when
// the broker carries them.
func someValues(e *env, lane, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		switch {
		case e.h.Features.BinaryValues && i%5 == 3:
			out[i] = []byte{0, 0xff, byte(i), 0xfe, 0x80, byte(lane)}
		case i%5 == 4:
			out[i] = fmt.Appendf(nil, `{"lane":%d,"n":%d,"text":"ünïcode ✓"}`, lane, i)
		default:
			out[i] = fmt.Appendf(nil, "message %d of lane %d", i, lane)
		}
	}
	return out
}

// testOneBatchPerLane: while a batch of a lane is in flight, Fetch hands
// out nothing else of that lane (check reports a second batch of it).
func testOneBatchPerLane(e *env) {
	want := e.publishN(0, 12)
	first := e.fetch(3)
	for {
		b, err := e.tryFetch(context.Background(), 3, 500*time.Millisecond)
		if err != nil {
			break
		}
		// Only another lane may deliver now (a standard queue's other
		// receiver); a batch of first's lane was reported by check.
		e.ack(b)
		if b.Lane == first.Lane {
			break
		}
	}
	e.ack(first)
	e.drain(10, want)
}

// testValues: values arrive byte for byte: text, a large one, binary ones
// where the broker carries them, empty ones where it can, and nil distinct
// from empty where the source tells them apart.
func testValues(e *env) {
	f := e.h.Features
	values := [][]byte{
		[]byte("plain"),
		[]byte("ünïcödé ✓ ∑ ß"),
		[]byte(" leading and trailing spaces "),
		[]byte(strings.Repeat("0123456789abcdef", 4096)), // 64 KiB
	}
	if f.BinaryValues {
		values = append(values, []byte{0}, []byte{0xff, 0xfe, 0, 0x80, '\n'})
	}
	empty, null := -1, -1
	if !f.NoEmptyValues {
		empty = len(values)
		values = append(values, []byte{})
	}
	if f.NilValues {
		null = len(values)
		values = append(values, nil)
	}
	want := e.publish(0, values...)
	got := e.drain(10, want)
	byTag := map[string]*consumer.Message{}
	for _, m := range got {
		byTag[tag(m)] = m
	}
	for i, t := range want {
		m := byTag[t]
		if m == nil {
			continue // drain fails before
		}
		switch {
		case i == empty && f.NilValues && m.Value == nil:
			e.Errorf("an empty value was delivered as nil; the source tells nil from empty (Features.NilValues)")
		case i == null && m.Value != nil:
			e.Errorf("a nil value was delivered as %s", showValue(m.Value))
		}
	}
}
