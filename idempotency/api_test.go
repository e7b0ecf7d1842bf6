package idempotency_test

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

func TestReplay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true}, nil)
	first := e.post(t, "k1", `{"amount":500,"to":"acct_9"}`)
	wantStatus(t, first, http.StatusCreated)
	if first.header.Get(idempotency.ReplayedHeader) != "" || first.header.Get("X-Not-Stored") != "1" {
		t.Fatalf("first response headers %v", first.header)
	}
	again := e.post(t, "k1", `{ "to": "acct_9", "amount": 500 }`)
	wantStatus(t, again, http.StatusCreated)
	if !bytes.Equal(again.body, first.body) {
		t.Fatalf("replayed body %s, first %s", again.body, first.body)
	}
	if again.header.Get(idempotency.ReplayedHeader) != "true" ||
		again.header.Get("Location") != first.header.Get("Location") ||
		again.header.Get("Content-Type") != "application/json" ||
		again.header.Get("X-Not-Stored") != "" {
		t.Fatalf("replayed headers %v", again.header)
	}
	// A quoted Structured Field string names the same key.
	quoted := e.post(t, `"k1"`, `{"amount":500,"to":"acct_9"}`)
	if !bytes.Equal(quoted.body, first.body) {
		t.Fatalf("quoted key: body %s", quoted.body)
	}
	if n := e.count(t, "true"); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}

func TestMismatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true}, nil)
	wantStatus(t, e.post(t, "k1", `{"amount":500,"to":"acct_9"}`), http.StatusCreated)
	r := e.post(t, "k1", `{"amount":501,"to":"acct_9"}`)
	wantStatus(t, r, http.StatusUnprocessableEntity)
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q", ct)
	}
	if n := e.count(t, "true"); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}

func TestBadRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true}, nil)
	cases := []struct {
		name, key, body string
		hdr             []string
		want            int
	}{
		{"no key", "", `{"amount":1,"to":"a"}`, nil, http.StatusBadRequest},
		{"key too long", strings.Repeat("k", 256), `{"amount":1,"to":"a"}`, nil, http.StatusBadRequest},
		{"key not ASCII", "k\u00e9", `{"amount":1,"to":"a"}`, nil, http.StatusBadRequest},
		{"key twice", "k1", `{"amount":1,"to":"a"}`, []string{"Idempotency-Key", "k2"}, http.StatusBadRequest},
		{"empty quoted key", `""`, `{"amount":1,"to":"a"}`, nil, http.StatusBadRequest},
		{"malformed JSON", "k3", `{"amount":1,`, nil, http.StatusBadRequest},
		{"body too large", "k4", `{"to":"` + strings.Repeat("x", 1<<20) + `"}`, nil, http.StatusRequestEntityTooLarge},
	}
	for _, c := range cases {
		r := e.post(t, c.key, c.body, c.hdr...)
		if r.status != c.want {
			t.Errorf("%s: status %d, want %d (%s)", c.name, r.status, c.want, r.body)
		}
	}
	if n, s, m := e.count(t, "true"), e.stored(t), e.markers(t); n+s+m != 0 {
		t.Fatalf("%d payments, %d responses, %d markers after bad requests", n, s, m)
	}
	// The longest key passes.
	wantStatus(t, e.post(t, strings.Repeat("k", 255), `{"amount":1,"to":"a"}`), http.StatusCreated)
}

func TestOptional(t *testing.T) {
	t.Parallel()
	var sawTx bool
	e := newEnv(t, idempotency.Config{SingleTenant: true, Optional: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawTx = idempotency.Tx(r.Context()) != nil
		w.WriteHeader(http.StatusNoContent)
	}))
	wantStatus(t, e.post(t, "", `{}`), http.StatusNoContent)
	if sawTx {
		t.Fatal("a request without a key got a transaction")
	}
}

// TestFinalRule: a 4xx rolls back (the client fixes the request and
// retries with the same key, which runs again); a 4xx marked Final is
// stored and replayed with its writes committed.
func TestFinalRule(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true}, nil)
	wantStatus(t, e.post(t, "k1", `{"amount":-5,"to":"acct_9"}`), http.StatusBadRequest)
	if n, s, m := e.count(t, "true"), e.stored(t), e.markers(t); n+s+m != 0 {
		t.Fatalf("after a 400: %d payments, %d responses, %d markers", n, s, m)
	}
	// The fixed request, same key, another body: not a mismatch, since
	// nothing was stored.
	wantStatus(t, e.post(t, "k1", `{"amount":5,"to":"acct_9"}`), http.StatusCreated)

	d := e.post(t, "k2", `{"amount":7,"to":"decline"}`)
	wantStatus(t, d, http.StatusPaymentRequired)
	again := e.post(t, "k2", `{"amount":7,"to":"decline"}`)
	wantStatus(t, again, http.StatusPaymentRequired)
	if !bytes.Equal(again.body, d.body) || again.header.Get(idempotency.ReplayedHeader) != "true" {
		t.Fatalf("final 402 not replayed: %s vs %s", again.body, d.body)
	}
	if n := e.count(t, "true"); n != 2 {
		t.Fatalf("%d payments, want 2", n)
	}
}

func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{Scope: func(r *http.Request) (string, error) {
		a := r.Header.Get("X-Account")
		if a == "" {
			return "", errors.New("no X-Account header")
		}
		return a, nil
	}}, nil)
	a := e.post(t, "same-key", `{"amount":1,"to":"x"}`, "X-Account", "acct_a")
	b := e.post(t, "same-key", `{"amount":2,"to":"y"}`, "X-Account", "acct_b")
	wantStatus(t, a, http.StatusCreated)
	wantStatus(t, b, http.StatusCreated) // not 422: another tenant's key
	if bytes.Equal(a.body, b.body) {
		t.Fatal("two tenants got the same response")
	}
	a2 := e.post(t, "same-key", `{"amount":1,"to":"x"}`, "X-Account", "acct_a")
	b2 := e.post(t, "same-key", `{"amount":2,"to":"y"}`, "X-Account", "acct_b")
	if !bytes.Equal(a2.body, a.body) || !bytes.Equal(b2.body, b.body) {
		t.Fatalf("replays crossed tenants: %s %s", a2.body, b2.body)
	}
	wantStatus(t, e.post(t, "same-key", `{"amount":1,"to":"x"}`), http.StatusBadRequest)
	if n := e.count(t, "key = 'same-key'"); n != 2 {
		t.Fatalf("%d payments, want 2", n)
	}
}

func TestResponseTooLarge(t *testing.T) {
	t.Parallel()
	big := false
	e := newEnv(t, idempotency.Config{SingleTenant: true, MaxResponseBytes: 100}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paymentsHandler(w, r)
		if big {
			w.Write(bytes.Repeat([]byte(" "), 100))
		}
	}))
	big = true
	wantStatus(t, e.post(t, "k1", `{"amount":1,"to":"x"}`), http.StatusInternalServerError)
	if n, s, m := e.count(t, "true"), e.stored(t), e.markers(t); n+s+m != 0 {
		t.Fatalf("after an oversized response: %d payments, %d responses, %d markers", n, s, m)
	}
	big = false
	wantStatus(t, e.post(t, "k1", `{"amount":1,"to":"x"}`), http.StatusCreated)
}

func TestStrategyRefused(t *testing.T) {
	t.Parallel()
	hw, err := highwater.New(highwater.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.NewPool(t)
	_, err = idempotency.New(pool, idempotency.Config{SingleTenant: true, Strategy: hw})
	if !errors.Is(err, pg.ErrInvalidConfig) || !strings.Contains(err.Error(), "highwater") {
		t.Fatalf("New with highwater: %v", err)
	}
	for _, cfg := range []idempotency.Config{{SingleTenant: true, Name: "a/b"}, {SingleTenant: true, MaxKeyLen: 100000}, {SingleTenant: true, Header: "Bad Header"}, {SingleTenant: true, Table: strings.Repeat("t", 60)}} {
		if _, err := idempotency.New(pool, cfg); !errors.Is(err, pg.ErrInvalidConfig) {
			t.Errorf("New(%+v): %v, want a config error", cfg, err)
		}
	}
}

// TestKeyOverStrategyLimit: a key the strategy refuses (longer than its
// MaxIDLen) gets 400, not a retry.
func TestKeyOverStrategyLimit(t *testing.T) {
	t.Parallel()
	s, err := idset.New(idset.Config{MaxIDLen: 40})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, idempotency.Config{SingleTenant: true, Strategy: s}, nil)
	r := e.post(t, strings.Repeat("k", 41), `{"amount":1,"to":"x"}`)
	wantStatus(t, r, http.StatusBadRequest)
	if n := e.count(t, "true"); n != 0 {
		t.Fatalf("%d payments, want 0", n)
	}
}

// A response without a body (a bare 201, a 204) is stored and replayed
// like any other: with an empty body.
func TestEmptyBodyStored(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := idempotency.Tx(r.Context()).Exec(r.Context(),
			`INSERT INTO payments (scope, key, amount, recipient) VALUES ('s', 'k1', 1, 'r')`); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	first := e.post(t, "k1", `{}`)
	wantStatus(t, first, http.StatusCreated)
	again := e.post(t, "k1", `{}`)
	wantStatus(t, again, http.StatusCreated)
	if len(again.body) != 0 || again.header.Get(idempotency.ReplayedHeader) != "true" {
		t.Fatalf("replay: body %q, headers %v", again.body, again.header)
	}
	if n := e.count(t, "true"); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}
