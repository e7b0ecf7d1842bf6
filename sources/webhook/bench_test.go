package webhook_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/webhook"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkDeliveries compares, over loopback with 16 concurrent clients
// per GOMAXPROCS,
// signed Stripe-style deliveries through the webhook source and a consumer
// whose handler inserts one row (marker and effect in one transaction per
// batch, each answered after its commit) with a bare handler that verifies
// the same signature and inserts the same row in a transaction of its own,
// with no dedupe; and the source again with its attempt counts in
// Postgres (Config.DB):
//
//	go test -run '^$' -bench Deliveries -benchtime 20000x ./sources/webhook/
func BenchmarkDeliveries(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		pool := benchPool(b)
		v := benchVerifier(b)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			if err := v.Verify(r, body); err != nil {
				http.Error(w, "unauthorized", http.StatusUnauthorized)
				return
			}
			id, err := webhook.JSONField("id")(r, body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			err = pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(r.Context(), `INSERT INTO effects (event_id, attempt, payload) VALUES ($1, 1, $2)`, id, body)
				return err
			})
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusOK)
		})
		srv := httptest.NewServer(h)
		defer srv.Close()
		runDeliveries(b, srv)
	})
	b.Run("webhook", func(b *testing.B) { benchSource(b, false) })
	b.Run("webhook+db", func(b *testing.B) { benchSource(b, true) })
}

// benchSource runs the deliveries through the webhook source, with the
// attempt counts in Postgres (Config.DB) when db is true.
func benchSource(b *testing.B, db bool) {
	pool := benchPool(b)
	cfg := webhook.Config{Verifier: benchVerifier(b), ID: webhook.JSONField("id"), Logger: testLogger()}
	if db {
		cfg.DB = pool
	}
	src, err := webhook.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		b.Fatal(err)
	}
	c, err := consumer.New(pool, src, consumer.Config{Name: "bench", Strategy: strategy, Handler: insertEffect, Logger: testLogger()})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := src.WaitRunning(wctx); err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(src)
	defer srv.Close()
	runDeliveries(b, srv)
}

var benchRun atomic.Int64

func benchPool(b *testing.B) *pgxpool.Pool {
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(b))
	if err != nil {
		b.Fatal(err)
	}
	pcfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (
		n bigserial PRIMARY KEY, event_id text NOT NULL, attempt int NOT NULL, payload bytea NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	return pool
}

func benchVerifier(b *testing.B) webhook.Verifier {
	v, err := webhook.NewStripeVerifier(webhook.StripeConfig{Secrets: []string{testSecret}})
	if err != nil {
		b.Fatal(err)
	}
	return v
}

// runDeliveries posts b.N distinct signed events from 16 clients per
// GOMAXPROCS and fails
// on any answer but 200.
func runDeliveries(b *testing.B, srv *httptest.Server) {
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
	run := benchRun.Add(1)
	var seq atomic.Int64
	b.SetParallelism(16) // 32 clients with GOMAXPROCS 2
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := event(fmt.Sprintf("evt_%d_%d", run, seq.Add(1)), 1)
			req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
			req.Header.Set("Stripe-Signature", stripeSign(testSecret, time.Now(), body))
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("answered %d", resp.StatusCode)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deliveries/s")
}
