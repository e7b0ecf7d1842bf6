package pg_test

import (
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// What users hand the library must satisfy pg.DB: a pool, a single
// connection and a transaction.
var (
	_ pg.DB = (*pgxpool.Pool)(nil)
	_ pg.DB = (*pgx.Conn)(nil)
	_ pg.DB = pgx.Tx(nil)
)
