package webhook_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/webhook"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// receiver is one process's webhook source, consumer and HTTP server.
type receiver struct {
	src *webhook.Source
	srv *httptest.Server
	run *consumertest.Running
}

// startReceiver starts a receiver on pool whose handler always fails.
func startReceiver(t *testing.T, pool *pgxpool.Pool, maxAttempts int) *receiver {
	t.Helper()
	src, err := webhook.New(webhook.Config{
		Verifier: webhook.Unverified(), ID: webhook.JSONField("id"), Logger: testLogger(),
		DB: pool,
	})
	if err != nil {
		t.Fatal(err)
	}
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := consumertest.NewConsumer(t, pool, src, consumer.Config{
		Name: "restarts", Strategy: strategy, MaxAttempts: maxAttempts, Logger: testLogger(),
		Handler: func(_ context.Context, _ pgx.Tx, m *consumer.Message) error {
			return fmt.Errorf("attempt %d fails", m.Attempt)
		},
	})
	r := &receiver{src: src, srv: httptest.NewServer(src), run: consumertest.Start(c)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := src.WaitRunning(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *receiver) stop(t *testing.T) {
	r.srv.Close()
	r.run.Stop(t)
	_ = r.src.Close()
}

func (r *receiver) post(t *testing.T, body []byte) int {
	t.Helper()
	resp, err := r.srv.Client().Post(r.srv.URL+"/hooks", "application/json", bytesReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestAttemptsSurviveRestart: an event whose handler always fails is
// parked at MaxAttempts even when its receiver is restarted between every
// two deliveries, and when its deliveries go to different processes: the
// count is kept in Postgres (Config.DB), written once each batch settled.
func TestAttemptsSurviveRestart(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	const maxAttempts = 3
	body := []byte(`{"id":"evt_restarts"}`)
	for i := 1; i <= maxAttempts; i++ {
		r := startReceiver(t, pool, maxAttempts)
		got := r.post(t, body)
		r.stop(t)
		want := http.StatusInternalServerError
		if i == maxAttempts {
			want = http.StatusOK
		}
		if got != want {
			t.Fatalf("delivery %d, each to a new receiver: %d, want %d", i, got, want)
		}
	}
	p := consumertest.Parked(t, pool, "", "")
	if len(p) != 1 || p[0].Reason != parked.ReasonMaxAttempts || p[0].Attempts != maxAttempts {
		t.Fatalf("parked %+v; want evt_restarts, max_attempts after %d", p, maxAttempts)
	}

	// Two processes at once share the count.
	a, b := startReceiver(t, pool, maxAttempts), startReceiver(t, pool, maxAttempts)
	defer a.stop(t)
	defer b.stop(t)
	other := []byte(`{"id":"evt_two_processes"}`)
	for i, r := range []*receiver{a, b, a} {
		want := http.StatusInternalServerError
		if i == 2 {
			want = http.StatusOK
		}
		if got := r.post(t, other); got != want {
			t.Fatalf("delivery %d: %d, want %d", i+1, got, want)
		}
	}
	if p := consumertest.Parked(t, pool, "", ""); len(p) != 2 {
		t.Fatalf("%d parked rows, want 2", len(p))
	}
}
