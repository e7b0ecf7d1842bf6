package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"

	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/sources/webhook"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Serve books transfers that arrive over HTTP until ctx is done: POST
// /transfers from clients, once per Idempotency-Key however often they
// retry, and POST /webhooks/bank, a bank's signed transfer events, through
// the consumer above, once per transfer_id. apiKeys maps each client's API
// key (its bearer token) to the client.
func Serve(ctx context.Context, pool *pgxpool.Pool, ln net.Listener, bankSecret string, apiKeys map[string]string) error {
	mw, err := idempotency.New(pool, idempotency.Config{
		Name: "ledger-api",
		// A key belongs to the client that authenticated, never to a
		// header the client could set to anyone's name.
		Scope: func(r *http.Request) (string, error) {
			token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if client, ok := apiKeys[token]; ok && token != "" {
				return client, nil
			}
			return "", errors.New("unknown API key")
		},
	})
	if err != nil {
		return err
	}
	if err := mw.Migrate(ctx); err != nil {
		return err
	}
	verifier, err := webhook.NewStripeVerifier(webhook.StripeConfig{Secrets: []string{bankSecret}})
	if err != nil {
		return err
	}
	events, err := webhook.New(webhook.Config{Verifier: verifier, ID: webhook.JSONField("transfer_id")})
	if err != nil {
		return err
	}
	defer events.Close()

	mux := http.NewServeMux()
	mux.Handle("POST /transfers", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var t Transfer
		if err := json.NewDecoder(r.Body).Decode(&t); err != nil {
			http.Error(w, "not a transfer", http.StatusBadRequest) // nothing stored: fix it, retry with the same key
			return
		}
		tx := idempotency.Tx(r.Context()) // the request's transaction: the row and the response commit together
		if _, err := tx.Exec(r.Context(), `INSERT INTO ledger (transfer_id, account, amount) VALUES ($1, $2, $3)`,
			t.ID, t.Account, t.Amount); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated) // stored: a retry with the key gets this again
	})))
	mux.Handle("POST /webhooks/bank", events) // answered 200 once the event's outcome committed

	// The server stops first, so that requests in progress get their
	// answers; then the consumer and the middleware's upkeep.
	server := &http.Server{Handler: mux}
	work, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 3)
	go func() { done <- server.Serve(ln) }()
	go func() { done <- mw.Run(work) }()            // retention of the keys and stored responses
	go func() { done <- Run(work, pool, events) }() // the consumer, fed by the webhook
	var first error
	running := 3
	select {
	case <-ctx.Done():
	case first = <-done: // a failure
		running--
	}
	_ = server.Shutdown(context.Background())
	stop()
	for ; running > 0; running-- {
		<-done
	}
	if errors.Is(first, http.ErrServerClosed) {
		first = nil
	}
	return first
}
