package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/idempotency"
)

// The HTTP benchmark: requests per second through the idempotency
// middleware against the same handler without it, and against the same
// handler with a hand-written key table (http_hand.go). Each handler
// writes one row per request; the bare one in a transaction of its own,
// the wrapped one in the request's transaction, where the middleware also
// reads the key's row and stores the response in it.

const httpTable = `CREATE TABLE IF NOT EXISTS http_payments (
    id     bigserial PRIMARY KEY,
    key    text   NOT NULL,
    amount bigint NOT NULL,
    payee  text   NOT NULL
)`

// SetupHTTP creates the benchmark's tables, the hand-written key table and
// the middleware's table (stored responses, which are the keys' claims) in pool's
// database, and returns the middleware. The benchmark has one caller, so
// the middleware is single-tenant, as the hand-written table is.
func SetupHTTP(ctx context.Context, pool *pgxpool.Pool) (*idempotency.Middleware, error) {
	mw, err := idempotency.New(pool, idempotency.Config{SingleTenant: true})
	if err != nil {
		return nil, err
	}
	if err := mw.Migrate(ctx); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, httpTable); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, httpKeysTable); err != nil {
		return nil, err
	}
	return mw, ResetHTTP(ctx, pool)
}

// ResetHTTP empties the benchmark's tables, markers and responses.
func ResetHTTP(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `TRUNCATE http_payments, http_keys, effectively.idempotency_responses`)
	return err
}

type httpPayment struct {
	Amount int64  `json:"amount"`
	To     string `json:"to"`
}

func decodePayment(w http.ResponseWriter, r *http.Request) (httpPayment, bool) {
	var p httpPayment
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return p, false
	}
	return p, true
}

const insertPayment = `INSERT INTO http_payments (key, amount, payee) VALUES ($1, $2, $3) RETURNING id`

func created(w http.ResponseWriter, id int64, p httpPayment) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/payments/%d", id))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"amount":%d,"to":%q}`, id, p.Amount, p.To)
}

// BareHandler writes the payment in a transaction of its own: what a
// handler without idempotency does.
func BareHandler(pool *pgxpool.Pool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := decodePayment(w, r)
		if !ok {
			return
		}
		tx, err := pool.Begin(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(r.Context())) }()
		var id int64
		if err := tx.QueryRow(r.Context(), insertPayment, r.Header.Get("Idempotency-Key"), p.Amount, p.To).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if err := tx.Commit(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		created(w, id, p)
	})
}

// IdempotentHandler is the same handler under mw, writing through the
// request's transaction.
func IdempotentHandler(mw *idempotency.Middleware) http.Handler {
	return mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := decodePayment(w, r)
		if !ok {
			return
		}
		key, _, _ := idempotency.Key(r.Context())
		var id int64
		if err := idempotency.Tx(r.Context()).QueryRow(r.Context(), insertPayment, key, p.Amount, p.To).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		created(w, id, p)
	}))
}

// LoadHTTP sends n POST requests to url from clients concurrent clients,
// each with a fresh Idempotency-Key (prefix and a number), and returns how
// long they took. Any answer but 201 is an error.
func LoadHTTP(ctx context.Context, url string, clients, n int, prefix string) (time.Duration, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	var next atomic.Int64
	var once sync.Once
	var failure error
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil {
					return
				}
				if err := postOne(ctx, c, url, fmt.Sprintf("%s-%d", prefix, i), i); err != nil {
					once.Do(func() { failure = err })
					next.Store(int64(n))
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), failure
}

func postOne(ctx context.Context, c *http.Client, url, key string, i int64) error {
	body := fmt.Sprintf(`{"amount":%d,"to":"acct_%d"}`, i, i%1000)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("POST %s: %d %s", key, resp.StatusCode, b)
	}
	return nil
}
