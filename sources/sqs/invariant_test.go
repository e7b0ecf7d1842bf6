package sqs_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/sources/sqs"
	"github.com/jackc/pgx/v5"
)

// sendParallel sends msgs from several goroutines.
func sendParallel(t *testing.T, e *e2e, msgs []outgoing) {
	t.Helper()
	const workers = 8
	var wg sync.WaitGroup
	per := (len(msgs) + workers - 1) / workers
	for w := range workers {
		lo, hi := w*per, min((w+1)*per, len(msgs))
		if lo >= hi {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			send(t, e.c, e.queue, msgs[lo:hi])
		}()
	}
	wg.Wait()
}

// TestInvariant: 20,000 logical messages, a tenth of them sent twice by the
// producer, with lost deletes, failing handlers and two simulated crashes
// (processes that die after committing, before deleting) over 4 receivers:
// every message has exactly one effect, nothing is parked, and the queue
// ends empty.
func TestInvariant(t *testing.T) {
	if testing.Short() {
		t.Skip("the invariant run takes a few seconds")
	}
	t.Parallel()
	c := client(t)
	e := newE2E(t, fauxqs.NewQueue(t, c, "invariant", nil))
	const n = 20000
	logical := keyed("m", n)
	rng := rand.New(rand.NewPCG(1, 2))
	msgs := append([]outgoing(nil), logical...)
	for range n / 10 {
		msgs = append(msgs, logical[rng.IntN(n)])
	}
	rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	sendParallel(t, e, msgs)

	// A batch holding a "failing" message fails on its first attempt; the
	// consumer isolates the message and retries it.
	failing := func(m *consumer.Message) bool {
		h := fnv.New32a()
		h.Write(m.Value)
		return h.Sum32()%500 == 0 && m.Attempt == 1
	}
	var handlerFailures atomic.Int64
	handler := func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		for _, m := range msgs {
			if failing(m) {
				handlerFailures.Add(1)
				return errors.New("transient failure")
			}
		}
		return insertEffects(ctx, tx, msgs)
	}

	var lost atomic.Int64
	process := func() (*faultySource, *consumertest.Running) {
		var mu sync.Mutex
		r := rand.New(rand.NewPCG(rng.Uint64(), 3))
		src := &faultySource{Source: e.source(sqs.Config{Receivers: 4}), drop: func(*consumer.Message) bool {
			mu.Lock()
			defer mu.Unlock()
			return r.Float64() < 0.02
		}}
		return src, consumertest.Start(e.consumer(src, consumer.Config{BatchHandler: handler, BatchSize: 100, Concurrency: 4}))
	}
	crash := func(src *faultySource, run *consumertest.Running) {
		src.die()
		time.Sleep(50 * time.Millisecond) // let batches in flight commit without their deletes
		run.Stop(t)
		if err := src.Close(); err != nil {
			t.Logf("close after crash: %v", err)
		}
		lost.Add(int64(src.lostAcks()))
	}

	began := time.Now()
	for i, at := range []int{n / 3, 2 * n / 3} {
		src, run := process()
		e.waitFor(fmt.Sprintf("%d effects before crash %d", at, i+1), time.Minute, func() bool { return e.distinctEffects() >= at })
		crash(src, run)
	}
	src, run := process()
	e.waitFor("every message applied and the queue empty", 2*time.Minute, e.drained(n))
	run.Stop(t)
	lost.Add(int64(src.lostAcks()))
	elapsed := time.Since(began)

	counts := e.effectCounts()
	for id, k := range counts {
		if k != 1 {
			t.Errorf("message %s has %d effects", id, k)
		}
	}
	if len(counts) != n {
		t.Fatalf("effects for %d distinct messages, want %d", len(counts), n)
	}
	if p := e.parked(); len(p) != 0 {
		t.Fatalf("%d messages parked, first %+v; want none", len(p), p[0])
	}
	st := e.hooks.Total()
	t.Logf("%d SQS messages (%d logical) in %s: %d deliveries, %d applied, %d duplicates, %d retried, %d lost deletes, %d handler failures",
		len(msgs), n, elapsed.Round(time.Millisecond), st.Size, st.Applied, st.Duplicate, st.Retried, lost.Load(), handlerFailures.Load())
	if st.Applied != n || lost.Load() == 0 || st.Retried == 0 || st.Duplicate < len(msgs)-n {
		t.Fatalf("stats %+v: the run did not exercise lost deletes, retries and duplicates", st)
	}
}
