package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// env is a payments API under the middleware on a fresh database.
type env struct {
	pool *pgxpool.Pool
	mw   *idempotency.Middleware
	srv  *httptest.Server
}

type payment struct {
	Amount int    `json:"amount"`
	To     string `json:"to"`
}

// paymentsHandler records one payment row per call through the request's
// transaction and answers 201 with the row's server-generated ID, so that
// two runs of the effect would answer two different bodies. A body with a
// negative amount gets 400 (not final), or 402 made final when the
// recipient is "decline".
func paymentsHandler(w http.ResponseWriter, r *http.Request) {
	var p payment
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	key, scope, _ := idempotency.Key(r.Context())
	tx := idempotency.Tx(r.Context())
	var id int64
	if err := tx.QueryRow(r.Context(), `INSERT INTO payments (scope, key, amount, recipient) VALUES ($1, $2, $3, $4) RETURNING id`,
		scope, key, p.Amount, p.To).Scan(&id); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	switch {
	case p.To == "decline":
		idempotency.Final(r.Context())
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusPaymentRequired)
		fmt.Fprintf(w, `{"id":%d,"status":"declined"}`, id)
		return
	case p.Amount < 0:
		http.Error(w, "negative amount", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/payments/%d", id))
	w.Header().Set("X-Not-Stored", "1")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"amount":%d,"to":%q}`, id, p.Amount, p.To)
}

const paymentsTable = `CREATE TABLE payments (
    id        bigserial PRIMARY KEY,
    scope     text   NOT NULL,
    key       text   NOT NULL,
    amount    bigint NOT NULL,
    recipient text   NOT NULL
)` // no unique key: a second effect must show as a second row

// newEnv migrates a fresh database and serves h (paymentsHandler when nil)
// under a middleware for cfg.
func newEnv(t testing.TB, cfg idempotency.Config, h http.Handler) *env {
	t.Helper()
	return newEnvPool(t, pgtest.NewPool(t), cfg, h)
}

func newEnvPool(t testing.TB, pool *pgxpool.Pool, cfg idempotency.Config, h http.Handler) *env {
	t.Helper()
	return newEnvDB(t, pool, pool, cfg, h)
}

// newEnvDB is newEnvPool with the middleware reaching the database through db.
func newEnvDB(t testing.TB, pool *pgxpool.Pool, db pg.DB, cfg idempotency.Config, h http.Handler) *env {
	t.Helper()
	ctx := context.Background()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	mw, err := idempotency.New(db, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := mw.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if _, err := pool.Exec(ctx, paymentsTable); err != nil {
		t.Fatal(err)
	}
	if h == nil {
		h = http.HandlerFunc(paymentsHandler)
	}
	srv := httptest.NewServer(mw.Wrap(h))
	t.Cleanup(srv.Close)
	return &env{pool: pool, mw: mw, srv: srv}
}

// reply is a response as the client read it.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// post sends body to /payments with key (no header when empty) and extra
// headers as name, value pairs.
func (e *env) post(t testing.TB, key, body string, hdr ...string) reply {
	t.Helper()
	return e.postCtx(context.Background(), t, key, body, hdr...)
}

func (e *env) postCtx(ctx context.Context, t testing.TB, key, body string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+"/payments", bytes.NewBufferString(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// count returns the number of payments rows matching where.
func (e *env) count(t testing.TB, where string, args ...any) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM payments WHERE `+where, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// stored returns the number of stored responses.
func (e *env) stored(t testing.TB) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM effectively.idempotency_responses`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// markers returns the number of idset markers (none when no strategy made
// their table).
func (e *env) markers(t testing.TB) int {
	t.Helper()
	ctx := context.Background()
	var exists bool
	if err := e.pool.QueryRow(ctx, `SELECT to_regclass('effectively.processed') IS NOT NULL`).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if !exists {
		return 0
	}
	var n int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM effectively.processed`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func wantStatus(t testing.TB, r reply, want int) {
	t.Helper()
	if r.status != want {
		t.Fatalf("status %d, want %d; body %s", r.status, want, r.body)
	}
}

// peekBody returns r's body and leaves it readable again.
func peekBody(r *http.Request) []byte {
	b, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(b))
	return b
}

// bodyHold holds a response until flush.
type bodyHold struct {
	http.ResponseWriter
	status int
	buf    bytes.Buffer
}

func (b *bodyHold) WriteHeader(s int)           { b.status = s }
func (b *bodyHold) Write(p []byte) (int, error) { return b.buf.Write(p) }
func (b *bodyHold) flush() {
	if b.status != 0 {
		b.ResponseWriter.WriteHeader(b.status)
	}
	b.ResponseWriter.Write(b.buf.Bytes())
}
