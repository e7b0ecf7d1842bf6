package webhook_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/sources/webhook"
	"github.com/jackc/pgx/v5"
)

// TestRedeliveries: an event delivered again and again, one delivery after
// the other and many at once, is applied once, and every delivery is
// answered 200 only when the effect row is in Postgres.
func TestRedeliveries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, webhook.Config{}, consumer.Config{})
	e.start()

	for i := range 5 {
		r := e.post(event("evt_seq", 100))
		expectStatus(t, fmt.Sprintf("delivery %d of evt_seq", i+1), r, http.StatusOK)
		if n := e.effects("evt_seq"); n != 1 {
			t.Fatalf("after delivery %d answered 200, evt_seq has %d effects, want 1", i+1, n)
		}
	}

	const events, copies = 20, 10
	var wg sync.WaitGroup
	for i := range events {
		id := fmt.Sprintf("evt_conc_%d", i)
		for range copies {
			wg.Go(func() {
				r := e.post(event(id, i))
				if r.status != http.StatusOK {
					t.Errorf("%s: answered %d %q, want 200", id, r.status, r.body)
					return
				}
				if n := e.effects(id); n != 1 {
					t.Errorf("%s answered 200 with %d effects in Postgres, want 1", id, n)
				}
			})
		}
	}
	wg.Wait()
	counts := e.effectCounts()
	if len(counts) != events+1 {
		t.Errorf("effects of %d events, want %d", len(counts), events+1)
	}
	for id, n := range counts {
		if n != 1 {
			t.Errorf("%s has %d effects", id, n)
		}
	}
	if p := e.parked(); len(p) != 0 {
		t.Errorf("%d parked rows, want none", len(p))
	}
	st := e.hooks.Total()
	if st.Applied != events+1 || st.Duplicate != 4+events*(copies-1) {
		t.Errorf("consumer saw %v; want %d applied and %d duplicates", st, events+1, 4+events*(copies-1))
	}
}

// TestOutOfOrder: events delivered in another order than they were made,
// older ones again after newer ones, are each applied once.
func TestOutOfOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, webhook.Config{}, consumer.Config{})
	e.start()
	const n = 40
	var order []int
	for i := n - 1; i >= 0; i-- {
		order = append(order, i)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	again := rng.Perm(n)
	order = append(order, again...)
	for _, i := range order {
		id := fmt.Sprintf("evt_%02d", i)
		expectStatus(t, id, e.post(event(id, i)), http.StatusOK)
		if got := e.effects(id); got != 1 {
			t.Fatalf("%s answered 200 with %d effects", id, got)
		}
	}
	counts := e.effectCounts()
	if len(counts) != n {
		t.Fatalf("effects of %d events, want %d", len(counts), n)
	}
}

// TestRejected: requests with a bad, stale, missing or malformed
// signature, too large a body or the wrong method are refused with a 4xx,
// and leave nothing behind: no effect, no marker, no parked row. The same
// event, signed right, is then applied with its own body.
func TestRejected(t *testing.T) {
	t.Parallel()
	e := newEnv(t, webhook.Config{MaxBodyBytes: 4096}, consumer.Config{})
	e.start()
	forged := event("evt_target", 999)
	big := append(event("evt_target", 999), bytes.Repeat([]byte(" "), 5000)...)
	now := time.Now()
	cases := []struct {
		name   string
		method string
		body   []byte
		sig    string
		want   int
	}{
		{"wrong secret", http.MethodPost, forged, stripeSign("whsec_attacker", now, forged), http.StatusUnauthorized},
		{"stale timestamp", http.MethodPost, forged, stripeSign(testSecret, now.Add(-10*time.Minute), forged), http.StatusUnauthorized},
		{"timestamp ahead", http.MethodPost, forged, stripeSign(testSecret, now.Add(10*time.Minute), forged), http.StatusUnauthorized},
		{"signature of another body", http.MethodPost, forged, stripeSign(testSecret, now, event("evt_target", 1)), http.StatusUnauthorized},
		{"no signature", http.MethodPost, forged, "", http.StatusUnauthorized},
		{"malformed signature", http.MethodPost, forged, "v1=abc", http.StatusBadRequest},
		{"too large", http.MethodPost, big, stripeSign(testSecret, now, big), http.StatusRequestEntityTooLarge},
		{"GET", http.MethodGet, nil, "", http.StatusMethodNotAllowed},
	}
	for _, c := range cases {
		r := e.do(context.Background(), c.method, c.body, c.sig)
		expectStatus(t, c.name, r, c.want)
	}
	if got := e.results()[webhook.ResultRejected]; got != len(cases) {
		t.Errorf("Observe saw %d rejections, want %d", got, len(cases))
	}
	if n := e.effects("evt_target"); n != 0 {
		t.Fatalf("rejected requests left %d effects", n)
	}
	if p := e.parked(); len(p) != 0 {
		t.Fatalf("rejected requests left %d parked rows", len(p))
	}

	good := event("evt_target", 1)
	expectStatus(t, "the event signed right", e.post(good), http.StatusOK)
	var payload []byte
	if err := e.pool.QueryRow(context.Background(), `SELECT payload FROM effects WHERE event_id = 'evt_target'`).Scan(&payload); err != nil {
		t.Fatalf("the event signed right was not applied: %v", err)
	}
	if !bytes.Equal(payload, good) {
		t.Fatalf("applied %s, want the body signed right %s", payload, good)
	}
	if st := e.hooks.Total(); st.Size != 1 {
		t.Fatalf("the consumer was handed %d messages, want only the one signed right", st.Size)
	}
}

// TestFailThenSucceed: a handler that fails gets its delivery a 500 and
// nothing committed; the provider's redelivery succeeds, is answered 200,
// and the event is applied once, at its second attempt.
func TestFailThenSucceed(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	failing.Store(true)
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := insertEffect(ctx, tx, m); err != nil {
			return err
		}
		if failing.Load() {
			return errors.New("the payments service is down")
		}
		return nil
	}
	e := newEnv(t, webhook.Config{}, consumer.Config{Handler: handler})
	e.start()

	body := event("evt_flaky", 5)
	r := e.post(body)
	expectStatus(t, "the failing delivery", r, http.StatusInternalServerError)
	if r.header.Get("Retry-After") == "" {
		t.Errorf("a 500 without Retry-After")
	}
	if n := e.effects("evt_flaky"); n != 0 {
		t.Fatalf("a failed delivery left %d effects", n)
	}
	failing.Store(false)
	expectStatus(t, "the redelivery", e.post(body), http.StatusOK)
	var attempt int
	if err := e.pool.QueryRow(context.Background(), `SELECT attempt FROM effects WHERE event_id = 'evt_flaky'`).Scan(&attempt); err != nil {
		t.Fatal(err)
	}
	if attempt != 2 {
		t.Errorf("applied at attempt %d, want 2", attempt)
	}
	expectStatus(t, "a later redelivery", e.post(body), http.StatusOK)
	if n := e.effects("evt_flaky"); n != 1 {
		t.Fatalf("evt_flaky has %d effects, want 1", n)
	}
}

// TestPoison: an event the handler refuses for good is parked whole and
// answered 200, so the provider stops; its redelivery is a duplicate.
func TestPoison(t *testing.T) {
	t.Parallel()
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if strings.Contains(string(m.Value), "evt_poison") {
			return consumer.Permanent(errors.New("unknown event type"))
		}
		return insertEffect(ctx, tx, m)
	}
	e := newEnv(t, webhook.Config{}, consumer.Config{Handler: handler})
	e.start()
	body := event("evt_poison", 1)
	expectStatus(t, "the poison event", e.post(body), http.StatusOK)
	p := e.parked()
	if len(p) != 1 {
		t.Fatalf("%d parked rows, want 1", len(p))
	}
	if p[0].Reason != parked.ReasonPermanent || deref(p[0].DedupeID) != "evt_poison" || !bytes.Equal(p[0].Payload, body) || p[0].Source != webhook.SourceName {
		t.Fatalf("parked %+v; want evt_poison, reason permanent, its body", p[0])
	}
	if !hasHeader(p[0], "Stripe-Signature") || hasHeader(p[0], "Authorization") {
		t.Errorf("parked headers %v: want the request's, without Authorization", p[0].Headers)
	}
	expectStatus(t, "its redelivery", e.post(body), http.StatusOK)
	if p := e.parked(); len(p) != 1 {
		t.Fatalf("the redelivery made %d parked rows, want 1", len(p))
	}
	if n := e.effects("evt_poison"); n != 0 {
		t.Fatalf("the poison event has %d effects", n)
	}
	if st := e.hooks.Total(); st.Parked != 1 || st.Duplicate != 1 {
		t.Fatalf("consumer saw %v; want 1 parked, 1 duplicate", st)
	}
}

func hasHeader(p parked.Row, name string) bool {
	for _, h := range p.Headers {
		if h.Key == name {
			return true
		}
	}
	return false
}

// TestMaxAttempts: an event whose handler always fails is answered 500
// until its deliveries reach MaxAttempts, counted across the provider's
// redeliveries; the last is parked and answered 200.
func TestMaxAttempts(t *testing.T) {
	t.Parallel()
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return fmt.Errorf("attempt %d fails", m.Attempt)
	}
	e := newEnv(t, webhook.Config{}, consumer.Config{Handler: handler, MaxAttempts: 3})
	e.start()
	body := event("evt_doomed", 1)
	for i := 1; i < 3; i++ {
		expectStatus(t, fmt.Sprintf("delivery %d", i), e.post(body), http.StatusInternalServerError)
		if p := e.parked(); len(p) != 0 {
			t.Fatalf("parked after %d deliveries, want only after 3", i)
		}
	}
	expectStatus(t, "delivery 3", e.post(body), http.StatusOK)
	p := e.parked()
	if len(p) != 1 || p[0].Reason != parked.ReasonMaxAttempts || p[0].Attempts != 3 || deref(p[0].DedupeID) != "evt_doomed" {
		t.Fatalf("parked %+v; want evt_doomed, reason max_attempts, 3 attempts", p)
	}
	expectStatus(t, "delivery 4", e.post(body), http.StatusOK)
	if p := e.parked(); len(p) != 1 {
		t.Fatalf("%d parked rows after a fourth delivery, want 1", len(p))
	}
}

// TestNoEventID: a verified request whose event ID cannot be derived is
// parked whole, with reason invalid_key, and answered 200.
func TestNoEventID(t *testing.T) {
	t.Parallel()
	e := newEnv(t, webhook.Config{}, consumer.Config{})
	e.start()
	body := []byte(`{"type":"ping"}`)
	expectStatus(t, "an event without an id", e.post(body), http.StatusOK)
	p := e.parked()
	if len(p) != 1 || p[0].Reason != parked.ReasonInvalidKey || !bytes.Equal(p[0].Payload, body) {
		t.Fatalf("parked %+v; want the body, reason invalid_key", p)
	}
	if counts := e.effectCounts(); len(counts) != 0 {
		t.Fatalf("effects %v, want none", counts)
	}
}

// TestUnavailable: with no consumer fetching, or the source closed,
// requests are answered 503 and nothing is kept; once a consumer fetches,
// the same event is applied.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, webhook.Config{}, consumer.Config{})
	body := event("evt_early", 1)
	r := e.post(body)
	expectStatus(t, "before the consumer started", r, http.StatusServiceUnavailable)
	if r.header.Get("Retry-After") == "" {
		t.Errorf("a 503 without Retry-After")
	}
	e.start()
	expectStatus(t, "once it runs", e.post(body), http.StatusOK)
	e.stop()
	// A guard, not a wait: a source that missed the stop would hold the
	// request until its client gives up.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	late := event("evt_late", 1)
	expectStatus(t, "after it stopped", e.do(ctx, http.MethodPost, late, stripeSign(testSecret, time.Now(), late)), http.StatusServiceUnavailable)
	e.start()
	expectStatus(t, "once it runs again", e.post(event("evt_late", 1)), http.StatusOK)
	e.stop()
	if err := e.src.Close(); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, "after Close", e.post(event("evt_closed", 1)), http.StatusServiceUnavailable)
	if counts := e.effectCounts(); len(counts) != 2 || counts["evt_early"] != 1 || counts["evt_late"] != 1 {
		t.Fatalf("effects %v; want evt_early and evt_late once each", counts)
	}
	if err := e.src.WaitRunning(context.Background()); !errors.Is(err, webhook.ErrClosed) {
		t.Fatalf("WaitRunning after Close: %v, want ErrClosed", err)
	}
}

// TestClientGone: a request whose client goes away before the consumer
// fetched it is taken off the queue and never applied; its attempt is not
// counted, so the provider's redelivery is attempt 1.
func TestClientGone(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.DedupeKey.ID == "evt_blocker" {
			<-release
		}
		return insertEffect(ctx, tx, m)
	}
	// One worker: while the blocker's batch is in flight, nothing is
	// fetched.
	e := newEnv(t, webhook.Config{}, consumer.Config{Handler: handler, Concurrency: 1})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the server waits for the blocker's request
	gone := make(chan webhook.Delivery, 1)
	e.mu.Lock()
	e.watch = func(d webhook.Delivery) {
		if d.Result == webhook.ResultGone {
			gone <- d
		}
	}
	e.mu.Unlock()
	e.start()

	blocked := make(chan reply, 1)
	go func() { blocked <- e.post(event("evt_blocker", 1)) }()
	waitFor(t, "the blocker's batch in flight", func() bool { st := e.src.Stats(); return st.InFlight == 1 && st.Queued == 0 })

	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan reply, 1)
	body := event("evt_left", 1)
	go func() { left <- e.do(ctx, http.MethodPost, body, stripeSign(testSecret, time.Now(), body)) }()
	var d webhook.Delivery
	waitFor(t, "evt_left queued", func() bool { return e.src.Stats().Queued == 1 })
	cancel()
	select {
	case d = <-gone:
	case <-time.After(30 * time.Second):
		t.Fatal("no ResultGone for the request whose client left")
	}
	<-left
	if d.ID != "evt_left" {
		t.Fatalf("ResultGone for %q, want evt_left", d.ID)
	}
	unblock()
	expectStatus(t, "the blocker", <-blocked, http.StatusOK)
	if n := e.effects("evt_left"); n != 0 {
		t.Fatalf("the request whose client left was applied %d times", n)
	}
	expectStatus(t, "the provider's redelivery", e.post(body), http.StatusOK)
	var attempt int
	if err := e.pool.QueryRow(context.Background(), `SELECT attempt FROM effects WHERE event_id = 'evt_left'`).Scan(&attempt); err != nil {
		t.Fatal(err)
	}
	if attempt != 1 {
		t.Fatalf("applied at attempt %d, want 1: the dropped delivery was counted", attempt)
	}
	if st := e.hooks.Total(); st.Size != 2 {
		t.Fatalf("the consumer was handed %d messages, want 2 (the dropped one never)", st.Size)
	}
}

// waitFor polls cond until it holds, failing after a guard of 30s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestShutdownMidBatch: a consumer that stops while an event's batch is in
// flight (its handler cut off by the shutdown timeout) leaves nothing
// committed; the request is answered 503, the attempt is not counted, and
// the provider's redelivery to the restarted consumer applies the event.
func TestShutdownMidBatch(t *testing.T) {
	t.Parallel()
	var stuck atomic.Bool
	stuck.Store(true)
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := insertEffect(ctx, tx, m); err != nil {
			return err
		}
		if stuck.Load() {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	e := newEnv(t, webhook.Config{}, consumer.Config{Handler: handler, ShutdownTimeout: 50 * time.Millisecond})
	e.start()
	body := event("evt_cut", 1)
	first := make(chan reply, 1)
	go func() { first <- e.post(body) }()
	waitFor(t, "the batch in flight", func() bool { return e.src.Stats().InFlight == 1 })
	e.stop()
	r := <-first
	expectStatus(t, "the delivery cut off by the shutdown", r, http.StatusServiceUnavailable)
	if n := e.effects("evt_cut"); n != 0 {
		t.Fatalf("a delivery cut off left %d effects", n)
	}
	if st := e.src.Stats(); st.Tracked != 0 || st.InFlight != 0 {
		t.Fatalf("after the shutdown: %+v, want nothing tracked or in flight", st)
	}
	stuck.Store(false)
	e.start()
	expectStatus(t, "the redelivery", e.post(body), http.StatusOK)
	var attempt int
	if err := e.pool.QueryRow(context.Background(), `SELECT attempt FROM effects WHERE event_id = 'evt_cut'`).Scan(&attempt); err != nil {
		t.Fatal(err)
	}
	if attempt != 1 {
		t.Fatalf("applied at attempt %d, want 1: the delivery cut off by the shutdown was counted", attempt)
	}
}

// TestCloseEndsRun: closing the source makes the consumer's Run return nil
// once its batches settled (ErrClosed matches consumer.ErrSourceDone).
func TestCloseEndsRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, webhook.Config{}, consumer.Config{})
	done := make(chan error, 1)
	go func() { done <- e.cons.Run(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.src.WaitRunning(ctx); err != nil {
		t.Fatal(err)
	}
	expectStatus(t, "a delivery", e.post(event("evt_before_close", 1)), http.StatusOK)
	if err := e.src.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v, want nil after Close", err)
		}
	case <-ctx.Done():
		t.Fatal("Run did not return after the source was closed")
	}
	expectStatus(t, "after Close", e.post(event("evt_after_close", 1)), http.StatusServiceUnavailable)
}

// TestQueueFull: with MaxQueued requests waiting for the consumer, the next
// one waits for room; if its client gives up first, it was never queued.
func TestQueueFull(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.DedupeKey.ID == "evt_a" {
			<-release
		}
		return insertEffect(ctx, tx, m)
	}
	e := newEnv(t, webhook.Config{MaxQueued: 1}, consumer.Config{Handler: handler, Concurrency: 1})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	e.start()

	a, b := make(chan reply, 1), make(chan reply, 1)
	go func() { a <- e.post(event("evt_a", 1)) }()
	waitFor(t, "evt_a in flight", func() bool { st := e.src.Stats(); return st.InFlight == 1 && st.Queued == 0 })
	go func() { b <- e.post(event("evt_b", 1)) }()
	waitFor(t, "evt_b queued", func() bool { return e.src.Stats().Queued == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	c := event("evt_c", 1)
	r := e.do(ctx, http.MethodPost, c, stripeSign(testSecret, time.Now(), c))
	if r.status != 0 {
		t.Fatalf("a request past MaxQueued was answered %d before its client gave up", r.status)
	}
	var gone webhook.Delivery
	waitFor(t, "evt_c's end reported", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, d := range e.observed {
			if d.ID == "evt_c" {
				gone = d
				return true
			}
		}
		return false
	})
	if gone.Result != webhook.ResultGone || gone.Attempt != 0 {
		t.Fatalf("evt_c ended %v at attempt %d; want gone, never queued (attempt 0)", gone.Result, gone.Attempt)
	}
	unblock()
	expectStatus(t, "evt_a", <-a, http.StatusOK)
	expectStatus(t, "evt_b", <-b, http.StatusOK)
	expectStatus(t, "evt_c delivered again", e.post(c), http.StatusOK)
	if counts := e.effectCounts(); len(counts) != 3 || counts["evt_c"] != 1 {
		t.Fatalf("effects %v, want evt_a, evt_b and evt_c once each", counts)
	}
	if st := e.hooks.Total(); st.Size != 3 {
		t.Fatalf("the consumer was handed %d messages, want 3", st.Size)
	}
}
