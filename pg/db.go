package pg

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is how every package of the library reaches PostgreSQL: the consumer,
// the sources that keep state in the database, the strategies' maintenance,
// Migrate and the test helpers all take it. *pgxpool.Pool, *pgx.Conn and
// pgx.Tx have it.
//
// Work that must commit on its own (a strategy's maintenance, a sweep)
// should be given a pool or a connection, not a transaction.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// TxBeginner is the optional capability of a DB that sends a
// transaction's options, or a BEGIN of its own, with the BEGIN in one
// round trip. *pgxpool.Pool and *pgx.Conn have it.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Acquirer is the optional capability of a DB that hands out a
// connection of its own for a while (LISTEN, a pipeline of a
// transaction's statements). *pgxpool.Pool has it.
type Acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

var (
	_ TxBeginner = (*pgxpool.Pool)(nil)
	_ TxBeginner = (*pgx.Conn)(nil)
	_ Acquirer   = (*pgxpool.Pool)(nil)
)

// Beginner returns db's TxBeginner when db is a *pgxpool.Pool or a
// *pgx.Conn, and nil for any other DB. The library uses a capability only
// on the types it knows keep it consistent with DB's methods: a wrapper
// around a pool that overrides Begin (for tracing, or in a test) but
// embeds the pool's BeginTx would otherwise be bypassed. Any other DB is
// reached through DB's methods alone, so it behaves the same whichever
// operation the library performs.
func Beginner(db DB) TxBeginner {
	switch b := db.(type) {
	case *pgxpool.Pool:
		return b
	case *pgx.Conn:
		return b
	}
	return nil
}

// Pool returns db when it is a *pgxpool.Pool, and nil for any other DB,
// wrappers included (see Beginner).
func Pool(db DB) *pgxpool.Pool {
	p, _ := db.(*pgxpool.Pool)
	return p
}

// BeginIn starts a transaction on db at isolation level iso: in its
// BEGIN through Beginner, or with Begin and then SET TRANSACTION (the
// transaction's first statement) for any other DB.
func BeginIn(ctx context.Context, db DB, iso pgx.TxIsoLevel) (pgx.Tx, error) {
	if b := Beginner(db); b != nil {
		return b.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if iso != "" {
		if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL "+string(iso)); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	return tx, nil
}

// BeginInFunc runs f in a transaction BeginIn starts, committing when f
// returns nil and rolling back otherwise, as pgx.BeginFunc does.
func BeginInFunc(ctx context.Context, db DB, iso pgx.TxIsoLevel, f func(pgx.Tx) error) error {
	tx, err := BeginIn(ctx, db, iso)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := f(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
