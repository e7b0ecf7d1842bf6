package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/pgtest"
)

// A payments endpoint under the middleware: the retry of a request gets the
// first response, and the payment is written once.
func Example() {
	ctx := context.Background()
	c, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Stop()
	url, _ := c.CreateDatabase(ctx, "example")
	pool, _ := pgxpool.New(ctx, url)
	defer pool.Close()
	_, _ = pool.Exec(ctx, `CREATE TABLE payments (id bigserial PRIMARY KEY, amount bigint NOT NULL)`)

	// The scope is the caller as authentication established it (here a
	// bearer token mapped to its account), never a header the client picks.
	accounts := map[string]string{"tok_a": "acct_a"}
	scope := func(r *http.Request) (string, error) {
		acct, ok := accounts[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		if !ok {
			return "", errors.New("unknown bearer token")
		}
		return acct, nil
	}
	mw, err := idempotency.New(pool, idempotency.Config{Scope: scope, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := mw.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var id int64
		err := idempotency.Tx(r.Context()).QueryRow(r.Context(),
			`INSERT INTO payments (amount) VALUES (500) RETURNING id`).Scan(&id)
		if err != nil {
			http.Error(w, "failed", http.StatusInternalServerError) // rolled back: retry with the same key
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, id)
	})))
	defer srv.Close()

	post := func(body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer tok_a")
		req.Header.Set("Idempotency-Key", "order-7")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b))
	}
	post(`{"amount":500,"to":"acct_9"}`)
	post(`{ "to": "acct_9", "amount": 500 }`) // the same request, re-serialized
	post(`{"amount":900,"to":"acct_9"}`)      // the key reused for another request
	var n int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n)
	fmt.Println("payments:", n)
	// Output:
	// 201  {"payment":1}
	// 201 true {"payment":1}
	// 422  {"type":"about:blank","title":"Idempotency key reused","status":422,"detail":"This idempotency key was used with a different request (method, path or body)."}
	// payments: 1
}
