package dedupe

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
