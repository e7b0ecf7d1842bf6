package pgtest

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvPool returns a pool on the database that DATABASE_URL names or, when
// it is unset, on a throwaway server started with opts, announcing that on
// notice when it is not nil. closeAll closes the pool and stops that
// server. It is for example programs and tools that run on a user's
// database when given one; tests use NewPool.
func EnvPool(ctx context.Context, opts Options, notice io.Writer) (pool *pgxpool.Pool, closeAll func(), err error) {
	url := os.Getenv("DATABASE_URL")
	stop := func() {}
	if url == "" {
		if notice != nil {
			fmt.Fprintln(notice, "starting a throwaway PostgreSQL (set DATABASE_URL to use yours)…")
		}
		c, err := Start(ctx, opts)
		if err != nil {
			return nil, nil, err
		}
		url, stop = c.URL(), func() { _ = c.Stop() }
	}
	pool, err = pgxpool.New(ctx, url)
	if err != nil {
		stop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); stop() }, nil
}
