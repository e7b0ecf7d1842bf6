package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrTxOwned is returned by Commit and Rollback on the transaction Tx
// returns: the middleware commits it, together with the stored response,
// after the handler returns.
var ErrTxOwned = errors.New("idempotency: the request's transaction is committed by the middleware; return from the handler instead")

// request is what the middleware keeps in a wrapped request's context.
type request struct {
	tx    *ownedTx
	final bool
	key   string
	scope string
}

type ctxKey struct{}

func fromContext(ctx context.Context) *request {
	r, _ := ctx.Value(ctxKey{}).(*request)
	return r
}

// Tx returns the transaction of the request whose context ctx is (or
// derives from): the one the key was claimed in. The handler's writes go
// through it and commit together with the stored response, or not at all.
// Its Commit and Rollback return ErrTxOwned; savepoints (Begin) work.
// Tx returns nil outside a wrapped handler, and for a request that passed
// without a key (Config.Optional).
func Tx(ctx context.Context) pgx.Tx {
	r := fromContext(ctx)
	if r == nil || r.tx == nil {
		return nil
	}
	return r.tx
}

// Final marks the response of the request whose context ctx is as final:
// it is stored and replayed, and the handler's writes commit, even when
// its status is 4xx or 5xx (a declined card, say: the effect, recording
// the decline, happened). Without it, only a 1xx-3xx response is final,
// and an error response rolls back, so that the client can fix the request
// and retry with the same key. Final does nothing outside a wrapped
// handler.
func Final(ctx context.Context) {
	if r := fromContext(ctx); r != nil {
		r.final = true
	}
}

// Key returns the idempotency key and the tenant scope of the request
// whose context ctx is, and false outside a wrapped handler or for a
// request that passed without a key.
func Key(ctx context.Context) (key, scope string, ok bool) {
	r := fromContext(ctx)
	if r == nil || r.key == "" {
		return "", "", false
	}
	return r.key, r.scope, true
}

// ownedTx is the request's transaction as the handler sees it: everything
// but ending it. It keeps the first error the handler's statements met, so
// that a handler that answers a success after a failed write (its
// transaction then aborted) gets the answer that error calls for, not one
// for the aborted transaction.
type ownedTx struct {
	pgx.Tx
	failed error
}

func (*ownedTx) Commit(context.Context) error   { return ErrTxOwned }
func (*ownedTx) Rollback(context.Context) error { return ErrTxOwned }

func (t *ownedTx) note(err error) {
	if err != nil && t.failed == nil && !errors.Is(err, pgx.ErrNoRows) {
		t.failed = err
	}
}

func (t *ownedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := t.Tx.Exec(ctx, sql, args...)
	t.note(err)
	return tag, err
}

func (t *ownedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := t.Tx.Query(ctx, sql, args...)
	if err != nil {
		t.note(err)
		return rows, err
	}
	return &notedRows{Rows: rows, t: t}, nil
}

func (t *ownedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return notedRow{row: t.Tx.QueryRow(ctx, sql, args...), t: t}
}

func (t *ownedTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return &notedBatch{BatchResults: t.Tx.SendBatch(ctx, b), t: t}
}

func (t *ownedTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	n, err := t.Tx.CopyFrom(ctx, table, cols, src)
	t.note(err)
	return n, err
}

type notedRows struct {
	pgx.Rows
	t *ownedTx
}

func (r *notedRows) Close() { r.Rows.Close(); r.t.note(r.Rows.Err()) }
func (r *notedRows) Err() error {
	err := r.Rows.Err()
	r.t.note(err)
	return err
}

type notedRow struct {
	row pgx.Row
	t   *ownedTx
}

func (r notedRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	r.t.note(err)
	return err
}

type notedBatch struct {
	pgx.BatchResults
	t *ownedTx
}

func (b *notedBatch) Exec() (pgconn.CommandTag, error) {
	tag, err := b.BatchResults.Exec()
	b.t.note(err)
	return tag, err
}

func (b *notedBatch) Query() (pgx.Rows, error) {
	rows, err := b.BatchResults.Query()
	if err != nil {
		b.t.note(err)
		return rows, err
	}
	return &notedRows{Rows: rows, t: b.t}, nil
}

func (b *notedBatch) QueryRow() pgx.Row { return notedRow{row: b.BatchResults.QueryRow(), t: b.t} }

func (b *notedBatch) Close() error {
	err := b.BatchResults.Close()
	b.t.note(err)
	return err
}

// recorder captures a handler's response instead of sending it: the
// response is sent only once its fate (stored and committed, or rolled
// back) is known.
type recorder struct {
	header   http.Header
	status   int
	body     []byte
	limit    int
	overflow bool
}

func newRecorder(limit int) *recorder {
	return &recorder{header: make(http.Header), limit: limit}
}

// ErrResponseTooLarge is returned by a wrapped handler's Write once the
// response body passes Config.MaxResponseBytes; the request then rolls
// back and gets 500.
var ErrResponseTooLarge = errors.New("idempotency: response body over Config.MaxResponseBytes")

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if status < 100 || status > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", status)) // as net/http does; the transaction rolls back
	}
	if r.status == 0 && status >= 200 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if r.overflow || len(r.body)+len(p) > r.limit {
		r.overflow = true
		return 0, ErrResponseTooLarge
	}
	r.body = append(r.body, p...)
	return len(p), nil
}

// result returns the recorded status, 200 when the handler wrote nothing.
func (r *recorder) result() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
