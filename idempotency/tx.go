package idempotency

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/internal/pgerr"
	"github.com/effectively-once/effectively/pg"
)

// A request's transaction costs the middleware no round trip beyond the
// handler's plain BEGIN … COMMIT when db is a *pgxpool.Pool: BEGIN, the
// key's lock and the claim go in one pipeline (lazyTx), and so do the
// stored response's INSERT and the COMMIT, on a connection the middleware
// holds. Other DBs that can begin with a query of their own take BEGIN and
// the lock in one round trip (a simple-protocol query of two statements),
// then the claim and the INSERT as statements of their own.

// keyTx is one request's transaction.
type keyTx struct {
	pgx.Tx
	conn  *pgxpool.Conn // held from the pool when db is one; released at the end
	ended bool
}

// lockedSQL begins a transaction and takes the key's lock, failing with a
// division by zero (SQLSTATE 22012) when another transaction holds it.
func lockedSQL(key int64) string {
	return "BEGIN; SELECT 1 / pg_try_advisory_xact_lock(" + strconv.FormatInt(key, 10) + ")::int"
}

// begin opens a transaction holding the lock of key; locked is false, and
// nothing is open, when another transaction holds it.
func (m *Middleware) beginLocked(ctx context.Context, key int64) (t *keyTx, locked bool, err error) {
	if a := pg.Pool(m.db); a != nil {
		c, err := a.Acquire(ctx)
		if err != nil {
			return nil, false, err
		}
		// BEGIN and the lock go with the claim: a held lock shows as the
		// claim's error (inFlight).
		return &keyTx{Tx: &lazyTx{conn: c.Conn(), lock: key}, conn: c}, true, nil
	}
	if b := pg.Beginner(m.db); b != nil {
		tx, err := b.BeginTx(ctx, pgx.TxOptions{BeginQuery: lockedSQL(key)})
		if inFlight(err) {
			// pgx leaves the failed transaction open on the connection.
			_, err = m.db.Exec(ctx, "ROLLBACK")
			return nil, false, err
		}
		if err != nil {
			return nil, false, err
		}
		return &keyTx{Tx: tx}, true, nil
	}
	tx, err := m.db.Begin(ctx)
	if err != nil {
		return nil, false, err
	}
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, key).Scan(&locked); err != nil || !locked {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, false, err
	}
	return &keyTx{Tx: tx}, true, nil
}

func inFlight(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "22012"
}

// rollback ends the transaction, if it is still open, and releases its
// connection.
func (t *keyTx) rollback(ctx context.Context) {
	if !t.ended {
		t.ended = true
		_ = t.Tx.Rollback(context.WithoutCancel(ctx))
	}
	if t.conn != nil {
		t.conn.Release()
		t.conn = nil
	}
}

// errStore marks a failure of the statement run before COMMIT.
type errStore struct{ err error }

func (e *errStore) Error() string { return e.err.Error() }
func (e *errStore) Unwrap() error { return e.err }

// commitWith runs sql with args and commits: in one round trip on a held
// connection. A failure of sql comes back as an *errStore (the transaction
// rolled back); any other error is the COMMIT's.
func (t *keyTx) commitWith(ctx context.Context, sql string, args ...any) error {
	if t.conn == nil {
		if _, err := t.Exec(ctx, sql, args...); err != nil {
			return &errStore{err}
		}
		t.ended = true
		return t.Commit(ctx)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	b.Queue("COMMIT")
	br := t.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		if pgerr.CommitUnknown(err) {
			// No answer to the INSERT: the COMMIT went out with it, and
			// may have committed.
			t.ended = true
			return err
		}
		return &errStore{err} // rollback ends the failed transaction
	}
	_, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	t.ended = true // COMMIT ran, or the connection is gone: the pool discards it unless idle
	return err
}
