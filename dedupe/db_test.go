package dedupe_test

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
)

// What users hand the library must satisfy dedupe.DB: a pool, a single
// connection and a transaction.
var (
	_ dedupe.DB = (*pgxpool.Pool)(nil)
	_ dedupe.DB = (*pgx.Conn)(nil)
	_ dedupe.DB = pgx.Tx(nil)
)
