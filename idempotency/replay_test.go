package idempotency_test

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/effectively-once/effectively/idempotency"
)

// TestReplaysNeverWait: retries of a completed key are answered from the
// store, all of them, however many arrive at once: the draft's 409 is for
// a key whose first request is still running, which this one's is not.
func TestReplaysNeverWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true}, nil)
	body := `{"amount":5,"to":"x"}`
	first := e.post(t, "k1", body)
	wantStatus(t, first, http.StatusCreated)

	const n = 16
	replies := make([]reply, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			replies[i] = e.post(t, "k1", body)
		})
	}
	close(start)
	wg.Wait()
	for i, r := range replies {
		if r.status != http.StatusCreated || !bytes.Equal(r.body, first.body) || r.header.Get(idempotency.ReplayedHeader) != "true" {
			t.Errorf("retry %d: %d %s (replayed %q), want the stored 201 %s", i, r.status, r.body, r.header.Get(idempotency.ReplayedHeader), first.body)
		}
	}
	if c := e.count(t, "true"); c != 1 {
		t.Fatalf("%d payments, want 1", c)
	}
}

// TestReplayWhileLockHeld: a retry of a completed key is replayed even
// while another session holds the key's lock (as a concurrent replay
// does), and a key changed meanwhile still gets 422.
func TestReplayWhileLockHeld(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true}, nil)
	body := `{"amount":5,"to":"x"}`
	first := e.post(t, "k1", body)
	wantStatus(t, first, http.StatusCreated)
	ctx := context.Background()
	holder, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, idempotency.LockKey(idempotency.DefaultName, "k1")); err != nil {
		t.Fatal(err)
	}
	r := e.post(t, "k1", body)
	wantStatus(t, r, http.StatusCreated)
	if !bytes.Equal(r.body, first.body) || r.header.Get(idempotency.ReplayedHeader) != "true" {
		t.Fatalf("replay while the lock is held: %s (replayed %q)", r.body, r.header.Get(idempotency.ReplayedHeader))
	}
	if loc := r.header.Get("Location"); loc != first.header.Get("Location") {
		t.Fatalf("Location %q, want %q", loc, first.header.Get("Location"))
	}
	wantStatus(t, e.post(t, "k1", `{"amount":6,"to":"x"}`), http.StatusUnprocessableEntity)
	wantStatus(t, e.post(t, "k2", body), http.StatusCreated) // another key is not held
}
