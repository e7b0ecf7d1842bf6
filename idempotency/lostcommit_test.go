package idempotency_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/pgtest"
)

// lossyNet is a network between the middleware and PostgreSQL that, once
// armed, loses the next write's reply (the server got it; the client
// never hears) or the write itself (the server never gets it). Armed from
// the handler after its own statements, the next write is the stored
// response's INSERT pipelined with COMMIT.
type lossyNet struct {
	armed     atomic.Bool
	loseWrite bool // lose the write itself, not its reply
	lost      atomic.Int32
	off       atomic.Bool // the handler no longer arms
}

func (d *lossyNet) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, d: d}, nil
}

type lossyConn struct {
	net.Conn
	d       *lossyNet
	mu      sync.Mutex
	written bool // the armed write went out; its reply is to be lost
}

func (c *lossyConn) Write(p []byte) (int, error) {
	if c.d.armed.CompareAndSwap(true, false) {
		if c.d.loseWrite {
			c.d.lost.Add(1)
			c.Conn.Close()
			return 0, errors.New("connection reset (the test lost the write)")
		}
		c.mu.Lock()
		c.written = true
		c.mu.Unlock()
	}
	return c.Conn.Write(p)
}

func (c *lossyConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	drop := c.written && n > 0
	c.mu.Unlock()
	if drop {
		// The server answered after Sync: the COMMIT ran. Lose the answer.
		c.d.lost.Add(1)
		c.Conn.Close()
		return 0, errors.New("connection reset (the test lost the reply to COMMIT)")
	}
	return n, err
}

// lossyEnv serves paymentsHandler through a pool of one connection (so
// that its statements are prepared by a first request) on a lossyNet,
// arming it in the handler for requests to recipient "arm".
func lossyEnv(t *testing.T, d *lossyNet, h *hookRecorder) *env {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.DialFunc = d.dial
	pcfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return newEnvPool(t, pool, idempotency.Config{SingleTenant: true, Hooks: []consumer.Hook{h}}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arm := string(peekBody(r)) == `{"amount":5,"to":"arm"}`
		paymentsHandler(&armAfter{ResponseWriter: w, arm: arm, d: d}, r)
	}))
}

// armAfter arms the network when the handler writes its response, after
// its statements.
type armAfter struct {
	http.ResponseWriter
	arm bool
	d   *lossyNet
}

func (a *armAfter) WriteHeader(s int) {
	if a.arm && !a.d.off.Load() {
		a.d.armed.Store(true)
	}
	a.ResponseWriter.WriteHeader(s)
}

// TestLostCommitReplyResolved: the COMMIT's reply is lost after the server
// committed. The middleware finds out on another connection that it did,
// answers the handler's response as a first response, and reports the
// request applied, not unknown.
func TestLostCommitReplyResolved(t *testing.T) {
	t.Parallel()
	d := &lossyNet{}
	h := &hookRecorder{reported: make(chan struct{}, 10)}
	e := lossyEnv(t, d, h)
	wantStatus(t, e.post(t, "warm", `{"amount":1,"to":"x"}`), http.StatusCreated) // prepares the statements
	<-h.reported
	r := e.post(t, "k1", `{"amount":5,"to":"arm"}`)
	<-h.reported
	if d.lost.Load() != 1 {
		t.Fatalf("%d replies lost, want 1: the test lost no commit", d.lost.Load())
	}
	wantStatus(t, r, http.StatusCreated)
	if r.header.Get(idempotency.ReplayedHeader) != "" || r.header.Get("X-Not-Stored") != "1" {
		t.Fatalf("answered as a replay, not as the first response: %v", r.header)
	}
	again := e.post(t, "k1", `{"amount":5,"to":"arm"}`)
	<-h.reported
	if string(again.body) != string(r.body) || again.header.Get(idempotency.ReplayedHeader) != "true" {
		t.Fatalf("retry: %d %s, want the replay of %s", again.status, again.body, r.body)
	}
	if n := e.count(t, "key = 'k1'"); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.outcomes[1] != consumer.OutcomeApplied {
		t.Fatalf("the resolved request was reported %v, want applied", h.outcomes[1])
	}
}

// TestLostCommitWriteResolved: the COMMIT never reaches the server, which
// rolls the transaction back. The middleware finds out that nothing
// committed and answers 503 with Retry-After, reported as retried, not
// unknown; the retry runs the request once.
func TestLostCommitWriteResolved(t *testing.T) {
	t.Parallel()
	d := &lossyNet{loseWrite: true}
	h := &hookRecorder{reported: make(chan struct{}, 10)}
	e := lossyEnv(t, d, h)
	wantStatus(t, e.post(t, "warm", `{"amount":1,"to":"x"}`), http.StatusCreated)
	<-h.reported
	r := e.post(t, "k1", `{"amount":5,"to":"arm"}`)
	<-h.reported
	if d.lost.Load() != 1 {
		t.Fatalf("%d writes lost, want 1", d.lost.Load())
	}
	wantStatus(t, r, http.StatusServiceUnavailable)
	if r.header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if n := e.count(t, "key = 'k1'"); n != 0 {
		t.Fatalf("%d payments after a COMMIT that never arrived", n)
	}
	h.mu.Lock()
	o := h.outcomes[1]
	h.mu.Unlock()
	if o != consumer.OutcomeRetried {
		t.Fatalf("reported %v, want retried (the outcome was found out)", o)
	}
	d.off.Store(true)
	wantStatus(t, e.post(t, "k1", `{"amount":5,"to":"arm"}`), http.StatusCreated)
	<-h.reported
	if n := e.count(t, "key = 'k1'"); n != 1 {
		t.Fatalf("%d payments after the retry, want 1", n)
	}
}
