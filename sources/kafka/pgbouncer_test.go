package kafka

import (
	"context"
	"testing"

	"github.com/effectively-once/effectively/pgtest"
)

// The Kafka source under the engine through PgBouncer in transaction
// pooling: offsets kept in Postgres (claimed with a transaction-local lock
// timeout, fenced by generation) and effects commit together through the
// pooler, and a consumer handing its partitions to another leaves every
// message applied exactly once.
func TestEngineResumeThroughPgBouncer(t *testing.T) {
	t.Parallel()
	const n = 2000
	e := newEnv(t, 3)
	e.pool = pgtest.NewBouncerPool(t, nil)
	if _, err := e.pool.Exec(context.Background(), `CREATE TABLE effects (msg_id text NOT NULL, lane text NOT NULL, off bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	h := e.resume(n)
	if tot := h.Total(); tot.Parked != 0 {
		t.Fatalf("%d messages parked through PgBouncer; %s", tot.Parked, h)
	}
}
