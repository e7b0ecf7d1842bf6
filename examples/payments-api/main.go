// Command payments-api is a small payments API behind the Idempotency-Key
// middleware (package idempotency), and a webhook endpoint for a payment
// provider's settlement events (package sources/webhook), on one
// PostgreSQL database, both effectively-once.
//
// It serves the API over loopback and drives it the way real clients and
// providers do:
//   - clients that lose responses and retry with backoff, send concurrent
//     duplicates of a request, reuse a key with a changed body (422), and
//     forget the key (400); a declined payment (402) is final and replayed;
//   - a provider that delivers each settlement event one to three times,
//     concurrently and out of order, signs one delivery with a wrong secret
//     (401) and sends one event for a payment that does not exist (parked).
//
// At the end it checks that money moved once per logical payment (every
// account's balance is what the logical payments say, and money was
// neither made nor lost), that every retry was answered with the first
// response, and that every payment was settled once; it prints a report
// and exits non-zero otherwise.
//
//	go run ./examples/payments-api
//
// It runs on a throwaway PostgreSQL (DATABASE_URL to use yours).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/webhook"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const schema = `
CREATE TABLE IF NOT EXISTS pay_accounts (
    tenant text NOT NULL, id text NOT NULL, balance bigint NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE TABLE IF NOT EXISTS pay_payments (
    id bigserial PRIMARY KEY, tenant text NOT NULL, src text NOT NULL, dst text NOT NULL,
    amount bigint NOT NULL, status text NOT NULL
);
CREATE TABLE IF NOT EXISTS pay_settlements (
    payment_id bigint NOT NULL, event_id text NOT NULL
);`

// Payment is the body of POST /v1/payments.
type Payment struct {
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount"`
}

// Receipt is the body of a payment's response.
type Receipt struct {
	ID     int64  `json:"id"`
	Status string `json:"status"`
	Amount int64  `json:"amount"`
}

// Event is a provider's settlement event.
type Event struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	PaymentID int64  `json:"payment_id"`
}

func main() {
	n := flag.Int("n", 2000, "logical payments")
	verbose := flag.Bool("v", false, "log what the middleware and the webhook consumer do")
	flag.Parse()
	if err := run(context.Background(), *n, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "payments-api:", err)
		os.Exit(1)
	}
}

// apiKeys maps each API key (sent as a bearer token) to its tenant, as a
// real service's key store does.
var apiKeys = map[string]string{
	"sk_acme_4eC39HqLyjWDarjtT1zdp7dc":   "acme",
	"sk_globex_9fB2kLq8ZxWm3RtY6nVp0sEa": "globex",
}

// apiKeyOf returns the API key of a tenant, for the example's clients.
func apiKeyOf(tenant string) string {
	for k, t := range apiKeys {
		if t == tenant {
			return k
		}
	}
	return ""
}

type tenantKey struct{}

// authenticate runs in front of the idempotency middleware: it maps the
// request's bearer token to its tenant, or answers 401 and nothing runs.
// The tenant comes from what the server checked, never from a header the
// client may set to anything.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		tenant, known := apiKeys[token]
		if !ok || !known {
			w.Header().Set("WWW-Authenticate", `Bearer realm="payments"`)
			http.Error(w, "unknown API key", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
	})
}

// tenantOf is the idempotency scope: the tenant authenticate established.
func tenantOf(r *http.Request) (string, error) {
	t, ok := r.Context().Value(tenantKey{}).(string)
	if !ok {
		return "", errors.New("the request was not authenticated")
	}
	return t, nil
}

// pay moves money between two accounts of the request's tenant, in the
// request's transaction: the payment row, both balances and the stored
// response commit together, or none of them.
func pay(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx := idempotency.Tx(ctx)
	tenant, _ := tenantOf(r)
	var p Payment
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Amount <= 0 || p.From == p.To {
		http.Error(w, "a payment needs two accounts and a positive amount", http.StatusBadRequest) // not stored
		return
	}
	// Both accounts are locked in one order, so that two payments between
	// the same accounts in opposite directions never deadlock.
	var found int
	var balance int64
	err := tx.QueryRow(ctx, `SELECT count(*), coalesce(sum(balance) FILTER (WHERE id = $2), 0) FROM (
  SELECT id, balance FROM pay_accounts WHERE tenant = $1 AND id IN ($2, $3) ORDER BY id FOR UPDATE) a`,
		tenant, p.From, p.To).Scan(&found, &balance)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if found != 2 {
		http.Error(w, "no such account", http.StatusNotFound) // not stored: the client may fix it and retry
		return
	}
	status := "pending"
	if balance < p.Amount {
		status = "declined" // recorded, and final: a retry gets the same answer
	}
	rec := Receipt{Status: status, Amount: p.Amount}
	err = tx.QueryRow(ctx, `INSERT INTO pay_payments (tenant, src, dst, amount, status) VALUES ($1, $2, $3, $4, $5) RETURNING id`,
		tenant, p.From, p.To, p.Amount, status).Scan(&rec.ID)
	if err == nil && status == "pending" {
		for _, a := range [...]struct {
			id    string
			delta int64
		}{{p.From, -p.Amount}, {p.To, p.Amount}} {
			if _, err = tx.Exec(ctx, `UPDATE pay_accounts SET balance = balance + $3 WHERE tenant = $1 AND id = $2`, tenant, a.id, a.delta); err != nil {
				break
			}
		}
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/payments/"+strconv.FormatInt(rec.ID, 10))
	if status == "declined" {
		idempotency.Final(ctx)
		w.WriteHeader(http.StatusPaymentRequired)
	} else {
		w.WriteHeader(http.StatusCreated)
	}
	_ = json.NewEncoder(w).Encode(rec)
}

// settle applies a settlement event: the payment it names is settled once.
// An event for a payment that does not exist is a poison event: parked,
// and answered 200 so the provider stops sending it. The first delivery
// of every 50th payment's event fails, as a downstream call that timed out
// would: it is answered 500, nothing of it commits, and the provider's
// redelivery applies it.
func (s *server) settle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	var e Event
	if err := json.Unmarshal(m.Value, &e); err != nil {
		return consumer.Permanent(fmt.Errorf("undecodable event: %w", err))
	}
	if _, seen := s.failed.LoadOrStore(e.ID, true); !seen && e.PaymentID%50 == 0 {
		return fmt.Errorf("event %s: the ledger service timed out", e.ID)
	}
	ct, err := tx.Exec(ctx, `UPDATE pay_payments SET status = 'settled' WHERE id = $1 AND status = 'pending'`, e.PaymentID)
	if err != nil {
		return err
	}
	if ct.RowsAffected() != 1 {
		return consumer.Permanent(fmt.Errorf("event %s: no pending payment %d", e.ID, e.PaymentID))
	}
	_, err = tx.Exec(ctx, `INSERT INTO pay_settlements (payment_id, event_id) VALUES ($1, $2)`, e.PaymentID, e.ID)
	return err
}

// server is the API and the webhook endpoint on one loopback listener.
type server struct {
	url    string
	secret string
	hooks  *outcomes
	stop   func()
	failed sync.Map // the events whose first delivery failed already
}

func serve(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) (*server, error) {
	s := &server{secret: "whsec_payments_example", hooks: &outcomes{}}
	mw, err := idempotency.New(pool, idempotency.Config{Name: "payments", Scope: tenantOf, Logger: log})
	if err != nil {
		return nil, err
	}
	if err := mw.Migrate(ctx); err != nil {
		return nil, err
	}
	verifier, err := webhook.NewStripeVerifier(webhook.StripeConfig{Secrets: []string{s.secret}})
	if err != nil {
		return nil, err
	}
	src, err := webhook.New(webhook.Config{Verifier: verifier, ID: webhook.JSONField("id"), Logger: log})
	if err != nil {
		return nil, err
	}
	ids, err := idset.New(idset.Config{})
	if err != nil {
		return nil, err
	}
	c, err := consumer.New(pool, src, consumer.Config{Name: "provider-events", Strategy: ids, Handler: s.settle,
		BatchSize: 100, MaxAttempts: 3, RetryBackoff: 10 * time.Millisecond, Logger: log, Hooks: []consumer.Hook{s.hooks}})
	if err != nil {
		return nil, err
	}
	if err := c.Migrate(ctx); err != nil {
		return nil, err
	}

	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", authenticate(mw.Wrap(http.HandlerFunc(pay))))
	mux.Handle("POST /webhooks/provider", src)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.url = "http://" + ln.Addr().String()
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 3)
	go func() { _ = hs.Serve(ln); done <- struct{}{} }()
	go func() { _ = mw.Run(runCtx); done <- struct{}{} }()
	go func() {
		if err := c.Run(runCtx); err != nil {
			log.Error("webhook consumer", "err", err)
		}
		done <- struct{}{}
	}()
	if err := src.WaitRunning(ctx); err != nil {
		cancel()
		return nil, err
	}
	s.stop = func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		_ = hs.Shutdown(sctx) // requests in progress wait for their batches
		cancel()
		for range 3 {
			<-done
		}
		_ = src.Close()
	}
	return s, nil
}

func run(ctx context.Context, n int, verbose bool) error {
	log := slog.New(slog.DiscardHandler)
	if verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	pool, closeDB, err := pgtest.EnvPool(ctx, pgtest.Options{}, os.Stdout) // DATABASE_URL, or a throwaway server
	if err != nil {
		return err
	}
	defer closeDB()
	if _, err := pool.Exec(ctx, schema); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	srv, err := serve(ctx, pool, log)
	if err != nil {
		return err
	}
	defer srv.stop()

	run := newRun(n, pool)
	if err := run.accounts(ctx); err != nil {
		return err
	}
	fmt.Printf("%d logical payments from %d clients that lose responses, retry and race duplicates…\n", n, clients)
	if err := run.payAll(ctx, srv.url); err != nil {
		return err
	}
	fmt.Printf("settlement events for the %d accepted payments, delivered 1-3 times each, out of order…\n", run.accepted())
	if err := run.settleAll(ctx, srv, srv.secret); err != nil {
		return err
	}
	return run.check(ctx, srv.hooks)
}
