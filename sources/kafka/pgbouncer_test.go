package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/consumertest"
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
	e.produce(0, n/2)
	h := &consumertest.Counter{}
	firstSrc := e.source()
	first := consumertest.Start(e.engine(firstSrc, h))
	e.waitEffects(n/4, 30*time.Second)
	e.produce(n/2, n)
	second := consumertest.Start(e.engine(e.source(), h))
	first.Stop(t)
	_ = firstSrc.Close() // leaves the group: the second consumer gets every partition
	e.waitEffects(n, 30*time.Second)
	second.Stop(t)
	if rows, distinct := e.effects(); rows != n || distinct != n {
		t.Fatalf("%d effect rows for %d distinct messages, want %d of each; %s", rows, distinct, n, h)
	}
	if tot := h.Total(); tot.Parked != 0 {
		t.Fatalf("%d messages parked through PgBouncer; %s", tot.Parked, h)
	}
}
