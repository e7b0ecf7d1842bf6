package idempotency_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/idempotency"
)

// TestStatusShapes: every status a handler can produce is stored as
// net/http sends it: 204 and 304 without a body, a handler that wrote
// nothing as 200, a 103 before the final status not at all.
func TestStatusShapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch string(peekBody(r)) {
		case `"204"`:
			w.WriteHeader(http.StatusNoContent)
			_, _ = w.Write([]byte("a body net/http would refuse"))
		case `"304"`:
			w.WriteHeader(http.StatusNotModified)
		case `"nothing"`:
		case `"103"`:
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write([]byte("created"))
		}
	}))
	for _, c := range []struct {
		body   string
		status int
		resp   string
	}{
		{`"204"`, http.StatusNoContent, ""},
		{`"304"`, http.StatusNotModified, ""},
		{`"nothing"`, http.StatusOK, ""},
		{`"103"`, http.StatusCreated, "created"},
	} {
		first := e.post(t, "k"+c.body, c.body)
		again := e.post(t, "k"+c.body, c.body)
		for i, r := range []reply{first, again} {
			if r.status != c.status || string(r.body) != c.resp {
				t.Errorf("%s, answer %d: %d %q, want %d %q", c.body, i, r.status, r.body, c.status, c.resp)
			}
		}
		if again.header.Get(idempotency.ReplayedHeader) != "true" {
			t.Errorf("%s: not replayed", c.body)
		}
	}
}

// TestInvalidStatusRollsBack: a status net/http cannot send (here 1000,
// on a response marked final) panics in the handler, as net/http's own
// WriteHeader does, before anything is stored; stored, it would make every
// retry panic after the commit, for ever.
func TestInvalidStatusRollsBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paymentsHandler(&statusAs{ResponseWriter: w, status: 1000}, r)
	}))
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/payments", strings.NewReader(`{"amount":5,"to":"decline"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k1")
	if resp, err := e.srv.Client().Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a handler writing status 1000 was answered %d", resp.StatusCode)
	}
	if n, s := e.count(t, "true"), e.stored(t); n+s != 0 {
		t.Fatalf("%d payments and %d responses after an invalid status", n, s)
	}
}

// statusAs writes status instead of the handler's.
type statusAs struct {
	http.ResponseWriter
	status int
}

func (s *statusAs) WriteHeader(int) { s.ResponseWriter.WriteHeader(s.status) }

// TestHugeStoredHeaders: stored header values count against
// MaxResponseBytes with the body: a response whose stored headers are over
// the limit is rolled back (500), as one whose body is.
func TestHugeStoredHeaders(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 2000)
	e := newEnv(t, idempotency.Config{SingleTenant: true, MaxResponseBytes: 1000, Headers: []string{"X-Big"}},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Big", big)
			paymentsHandler(w, r)
		}))
	r := e.post(t, "k1", `{"amount":5,"to":"x"}`)
	wantStatus(t, r, http.StatusInternalServerError)
	if n, s := e.count(t, "true"), e.stored(t); n+s != 0 {
		t.Fatalf("%d payments and %d responses after a response over the limit", n, s)
	}
	if bytes.Contains(r.body, []byte(big)) {
		t.Fatal("the rolled-back response was sent")
	}
}
