package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/idempotency"
)

// TestHandlerTxShapes: the request's transaction, begun in the claim's
// round trip, offers the handler what a pgx.Tx does: a savepoint whose
// failed statement is rolled back without failing the request, a batch, a
// COPY; its Commit and Rollback stay the middleware's.
func TestHandlerTxShapes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		tx := idempotency.Tx(ctx)
		key, scope, _ := idempotency.Key(ctx)
		fail := func(err error) { http.Error(w, err.Error(), http.StatusInternalServerError) }
		sp, err := tx.Begin(ctx)
		if err != nil {
			fail(err)
			return
		}
		if _, err := sp.Exec(ctx, `INSERT INTO payments (scope, key, amount, recipient) VALUES ($1, $2, 1, NULL)`, scope, key); err == nil {
			fail(errors.New("a NULL recipient was accepted"))
			return
		}
		if err := sp.Rollback(ctx); err != nil {
			fail(err)
			return
		}
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO payments (scope, key, amount, recipient) VALUES ($1, $2, 2, 'batch')`, scope, key)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			fail(err)
			return
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"payments"}, []string{"scope", "key", "amount", "recipient"},
			pgx.CopyFromRows([][]any{{scope, key, 3, "copy"}})); err != nil {
			fail(err)
			return
		}
		if err := tx.Commit(ctx); !errors.Is(err, idempotency.ErrTxOwned) {
			fail(errors.New("the handler could commit the request's transaction"))
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	wantStatus(t, e.post(t, "k1", `{}`), http.StatusCreated)
	if n := e.count(t, "key = 'k1'"); n != 2 {
		t.Fatalf("%d payments, want 2 (the batch's and the COPY's; the savepoint's rolled back)", n)
	}
	var amounts int
	if err := e.pool.QueryRow(context.Background(), `SELECT sum(amount) FROM payments`).Scan(&amounts); err != nil || amounts != 5 {
		t.Fatalf("sum of amounts %d (%v), want 5", amounts, err)
	}
	r := e.post(t, "k1", `{}`)
	wantStatus(t, r, http.StatusCreated)
	if r.header.Get(idempotency.ReplayedHeader) != "true" {
		t.Fatal("not replayed")
	}
}
