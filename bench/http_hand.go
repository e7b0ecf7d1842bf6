package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The hand-written comparison: what a team that does not use this library
// writes for idempotency keys, as Stripe describes it (insert the key, run
// the effect, store the response, all in one transaction). It is written
// as a competent team would: one table keyed by the key, the response
// stored by an UPDATE of the key's row, a raw-body hash against key reuse,
// a created_at index for expiry, and no framework around it.

const httpKeysTable = `CREATE TABLE IF NOT EXISTS http_keys (
    key         text        PRIMARY KEY,
    fingerprint bytea       NOT NULL,
    status      integer,
    body        bytea,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS http_keys_created_at_idx ON http_keys (created_at)`

// HandWrittenHandler is BareHandler with a hand-written idempotency key:
// a retry gets the stored response, a key reused with another body 422, a
// key whose first request is still running 409.
func HandWrittenHandler(pool *pgxpool.Pool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key := r.Header.Get("Idempotency-Key")
		if key == "" {
			http.Error(w, "Idempotency-Key required", http.StatusBadRequest)
			return
		}
		raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fp := sha256.Sum256(raw)
		r.Body = io.NopCloser(bytes.NewReader(raw))
		p, ok := decodePayment(w, r)
		if !ok {
			return
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		tag, err := tx.Exec(ctx, `INSERT INTO http_keys (key, fingerprint) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING`, key, fp[:])
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if tag.RowsAffected() == 0 {
			_ = tx.Rollback(ctx)
			handReplay(ctx, w, pool, key, fp[:])
			return
		}
		var id int64
		if err := tx.QueryRow(ctx, insertPayment, key, p.Amount, p.To).Scan(&id); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		rec := &bufferedResponse{header: http.Header{}}
		created(rec, id, p)
		if _, err := tx.Exec(ctx, `UPDATE http_keys SET status = $2, body = $3 WHERE key = $1`, key, rec.status, rec.body.Bytes()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if err := tx.Commit(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.body.Bytes())
	})
}

// handReplay answers a key that exists: its stored response, 422 for
// another body, 409 while its first request runs.
func handReplay(ctx context.Context, w http.ResponseWriter, pool *pgxpool.Pool, key string, fp []byte) {
	var stored []byte
	var status *int32
	var body []byte
	err := pool.QueryRow(ctx, `SELECT fingerprint, status, body FROM http_keys WHERE key = $1`, key).Scan(&stored, &status, &body)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		http.Error(w, "in progress", http.StatusConflict) // the first one rolled back meanwhile: retry
	case err != nil:
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
	case !bytes.Equal(stored, fp):
		http.Error(w, "key reused", http.StatusUnprocessableEntity)
	case status == nil:
		http.Error(w, "in progress", http.StatusConflict)
	default:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(int(*status))
		_, _ = w.Write(body)
	}
}

// bufferedResponse holds a response until its transaction committed.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header         { return b.header }
func (b *bufferedResponse) WriteHeader(s int)           { b.status = s }
func (b *bufferedResponse) Write(p []byte) (int, error) { return b.body.Write(p) }
