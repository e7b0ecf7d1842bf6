package idempotency_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/internal/childtest"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestKilledServerProcess: a server process is killed (SIGKILL) while its
// handler is inside a request, after it wrote the payment row. Its
// database connection dies with it, so its transaction rolls back: no
// row, no key. A retry of the request with the same key, served by
// another process, runs the effect (it is not a replay), and the payment
// exists once.
func TestKilledServerProcess(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	e := newEnvPool(t, pool, idempotency.Config{SingleTenant: true}, nil)

	child := childtest.Start(t, "TestKilledServerChild", "IDEMPOTENCY_KILL_CHILD="+pool.Config().ConnString())
	addr := child.Expect("ADDR ")
	const body = `{"amount":500,"to":"gate"}`
	sent := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("the killed server answered %d", resp.StatusCode)
		}
		sent <- err
	}()
	child.Expect("ENTERED") // the row is written, in the request's transaction
	if err := child.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Cmd.Wait()
	if err := <-sent; err != nil && strings.Contains(err.Error(), "answered") {
		t.Fatal(err)
	}

	// The retry may meet the dead server's transaction until its backend
	// noticed the closed connection: 409, and then the effect.
	r := retryConflict(t, e, "k1", body)
	wantStatus(t, r, http.StatusCreated)
	if r.header.Get(idempotency.ReplayedHeader) != "" {
		t.Fatalf("the retry was a replay: %s", r.body)
	}
	if n := e.count(t, "key = 'k1'"); n != 1 {
		t.Fatalf("%d payments for k1 after the kill and the retry, want 1", n)
	}
}

// TestKilledServerChild is the server TestKilledServerProcess kills: it
// serves the middleware over its database, prints its address, and holds a
// request inside its handler (after the handler wrote its row) until it is
// killed.
func TestKilledServerChild(t *testing.T) {
	dsn := os.Getenv("IDEMPOTENCY_KILL_CHILD")
	if dsn == "" {
		t.Skip("run by TestKilledServerProcess")
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idempotency.New(pool, idempotency.Config{SingleTenant: true})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	srv := &http.Server{Handler: mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paymentsHandler(&bodyHold{ResponseWriter: w}, r) // the row is written; the response never goes out
		fmt.Println("ENTERED")
		<-hold
	}))}
	fmt.Println("ADDR " + ln.Addr().String())
	_ = srv.Serve(ln)
}
