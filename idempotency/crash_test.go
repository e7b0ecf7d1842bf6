package idempotency_test

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/idempotency"
)

// gated serves paymentsHandler, except that a request whose body names
// the recipient "gate" writes its row, says so on entered, and then waits
// for release or for its context to end, and answers.
type gated struct {
	entered chan struct{}
	release chan struct{}
	done    chan struct{} // closed when a gated call returns
	once    sync.Once
	relOnce sync.Once
}

func newGated() *gated {
	return &gated{entered: make(chan struct{}, 1), release: make(chan struct{}), done: make(chan struct{})}
}

// open releases the gate; it may be called more than once.
func (g *gated) open() { g.relOnce.Do(func() { close(g.release) }) }

// newGatedEnv serves g, releasing the gate before the server closes (which
// waits for handlers) should the test end early.
func newGatedEnv(t *testing.T, cfg idempotency.Config, g *gated) *env {
	e := newEnv(t, cfg, g)
	t.Cleanup(g.open)
	return e
}

func (g *gated) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !bytes.Contains(peekBody(r), []byte(`"gate"`)) {
		paymentsHandler(w, r)
		return
	}
	defer g.once.Do(func() { close(g.done) })
	rec := &bodyHold{ResponseWriter: w}
	paymentsHandler(rec, r) // the row is written; the response is held
	g.entered <- struct{}{}
	select {
	case <-g.release:
		rec.flush()
	case <-r.Context().Done():
		rec.flush() // a handler that does not look at its context: 201 all the same
	}
}

// TestInFlight: a second request with the key while the first is inside
// its handler gets 409 with Retry-After at once; after the first commits,
// the retry gets its response.
func TestInFlight(t *testing.T) {
	t.Parallel()
	g := newGated()
	e := newGatedEnv(t, idempotency.Config{SingleTenant: true, RetryAfter: 2 * time.Second}, g)
	body := `{"amount":5,"to":"gate"}`
	first := make(chan reply, 1)
	go func() { first <- e.post(t, "k1", body) }()
	<-g.entered
	// Without the lock the request would wait for the first one's
	// transaction, which waits for the release below: bound the wait.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := e.postCtx(ctx, t, "k1", body)
	wantStatus(t, r, http.StatusConflict)
	if r.header.Get("Retry-After") != "2" {
		t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
	}
	g.open()
	f := <-first
	wantStatus(t, f, http.StatusCreated)
	again := e.post(t, "k1", body)
	if !bytes.Equal(again.body, f.body) {
		t.Fatalf("after commit: %d %s, want the first response %s", again.status, again.body, f.body)
	}
	if n := e.count(t, "true"); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}

// TestCancelMidHandler: the client goes away while the handler runs; the
// request rolls back, even though the handler answered 201, and the retry
// runs the effect once.
func TestCancelMidHandler(t *testing.T) {
	t.Parallel()
	g := newGated()
	e := newGatedEnv(t, idempotency.Config{SingleTenant: true}, g)
	body := `{"amount":5,"to":"gate"}`
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/payments", bytes.NewBufferString(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k1")
	errc := make(chan error, 1)
	go func() {
		resp, err := e.srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-g.entered
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the cancelled request got a response")
	}
	<-g.done
	g.open() // the retry passes the gate
	r := retryConflict(t, e, "k1", body)
	wantStatus(t, r, http.StatusCreated)
	if r.header.Get(idempotency.ReplayedHeader) != "" {
		t.Fatal("the retry was answered from the store: the interrupted request committed")
	}
	if n := e.count(t, "true"); n != 1 {
		t.Fatalf("%d payments, want 1 (the retry's)", n)
	}
}

// TestPanicMidHandler: a handler that panics after writing its row leaves
// neither row nor key; the retry runs the effect once.
func TestPanicMidHandler(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	panics := 1
	e := newEnv(t, idempotency.Config{SingleTenant: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paymentsHandler(w, r)
		mu.Lock()
		defer mu.Unlock()
		if panics > 0 {
			panics--
			panic(http.ErrAbortHandler) // the server closes the connection without logging
		}
	}))
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/payments", bytes.NewBufferString(`{"amount":5,"to":"x"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k1")
	if resp, err := e.srv.Client().Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a panicking handler answered %d", resp.StatusCode)
	}
	r := retryConflict(t, e, "k1", `{"amount":5,"to":"x"}`)
	wantStatus(t, r, http.StatusCreated)
	if r.header.Get(idempotency.ReplayedHeader) != "" {
		t.Fatal("the retry was answered from the store: the interrupted request committed")
	}
	if n := e.count(t, "true"); n != 1 {
		t.Fatalf("%d payments, want 1 (the retry's)", n)
	}
}

// retryConflict posts until the answer is not 409: the first request may
// still be rolling back.
func retryConflict(t *testing.T, e *env, key, body string) reply {
	t.Helper()
	for d := time.Millisecond; ; d = min(2*d, 100*time.Millisecond) {
		r := e.post(t, key, body)
		if r.status != http.StatusConflict {
			return r
		}
		time.Sleep(d) // a client's backoff
	}
}
