package bench

import (
	"context"
	"fmt"
	"os"

	"github.com/effectively-once/effectively/pgtest"
)

// Database returns the URL of the database a benchmark command runs on:
// DATABASE_URL when it is set, else a database "bench" on a throwaway
// PostgreSQL started with fsync on (as production runs), which stop stops.
// owned says the server is the command's own, so it may change server
// settings.
func Database(ctx context.Context) (url string, owned bool, stop func(), err error) {
	if url := os.Getenv("DATABASE_URL"); url != "" {
		return url, false, func() {}, nil
	}
	fmt.Fprintln(os.Stderr, "starting a throwaway PostgreSQL (fsync on)…")
	c, err := pgtest.Start(ctx, pgtest.Options{Fsync: true})
	if err != nil {
		return "", false, nil, err
	}
	if url, err = c.CreateDatabase(ctx, "bench"); err != nil {
		c.Stop()
		return "", false, nil, err
	}
	return url, true, func() { c.Stop() }, nil
}
