package franz

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/consumertest"
)

// TestOffsetsTableWentBack: the offsets table goes back behind a running
// source (as after a failover to a standby that lacked the last commits):
// the source's next offset write is fenced, it claims the partition again
// and consumes it from the offset the table holds. The range consumed
// again comes back as duplicates (its markers survived here), and nothing
// is applied twice.
func TestOffsetsTableWentBack(t *testing.T) {
	e := newEnv(t, 1)
	e.produce(0, 100)
	h := &consumertest.Counter{}
	src := e.source()
	r := consumertest.Start(e.engine(src, h))
	e.waitEffects(100, 30*time.Second)
	waitFor(t, 30*time.Second, "offset 100 stored", func() bool { return e.storedOffsets()[0][0] == 100 })
	if _, err := e.pool.Exec(context.Background(),
		`UPDATE effectively.kafka_offsets SET next_offset = 50 WHERE group_id = $1 AND topic = $2`, e.group, e.topic); err != nil {
		t.Fatal(err)
	}
	e.produce(100, 120)
	waitFor(t, time.Minute, "the 50 records from the stored offset on delivered again as duplicates", func() bool {
		return h.Total().Duplicate >= 50
	})
	e.waitEffects(120, 30*time.Second)
	waitFor(t, 30*time.Second, "offset 120 stored", func() bool { return e.storedOffsets()[0][0] == 120 })
	r.Stop(t)
	if rows, distinct := e.effects(); rows != 120 || distinct != 120 {
		t.Fatalf("%d effect rows for %d distinct messages, want 120 of each; %s", rows, distinct, h)
	}
	if got := h.Total().Duplicate; got != 50 {
		t.Errorf("%d duplicates, want the 50 records consumed again; %s", got, h)
	}
}
