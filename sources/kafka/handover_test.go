package kafka

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/consumertest"
	kafkago "github.com/segmentio/kafka-go"
)

// handover is how soon the partitions of a member that closed cleanly are
// consumed by another: kafka-go's Close sends LeaveGroup, the other member
// notices on its next heartbeat (200ms in the tests) and the group
// rebalances. Without the leave they would wait for the session timeout
// (6s in the tests).
const handover = time.Second

// TestCleanStopHandsOver: of two members, one stops cleanly (the
// consumer's Run ends, then Close, which leaves the group); a new message
// on each of its partitions is applied by the other within handover of
// the Close (the rebalance is eager: the remaining member's own
// partitions pause too).
func TestCleanStopHandsOver(t *testing.T) {
	e := newEnv(t, 4)
	e.produce(0, 40)
	h := &consumertest.Counter{}
	aSrc, bSrc := e.source(), e.source()
	a := consumertest.Start(e.engine(aSrc, h))
	b := consumertest.Start(e.engine(bSrc, h))
	defer b.Stop(t)
	waitFor(t, time.Minute, "both members to own partitions and the first messages applied", func() bool {
		_, d := e.effects()
		return len(aSrc.Assignment()) > 0 && len(bSrc.Assignment()) > 0 && len(aSrc.Assignment())+len(bSrc.Assignment()) == 4 && d == 40
	})
	moving := aSrc.Assignment()
	a.Stop(t)
	var msgs []kafkago.Message
	var ids []string
	for _, l := range moving {
		var p int
		if _, err := fmt.Sscanf(l, e.topic+"/%d", &p); err != nil {
			t.Fatalf("lane %q: %v", l, err)
		}
		id := fmt.Sprintf("after-stop-%d", p)
		ids = append(ids, id)
		msgs = append(msgs, kafkago.Message{Partition: p, Value: []byte(id), Headers: []kafkago.Header{{Key: DefaultIDHeader, Value: []byte(id)}}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.kafka.Produce(ctx, e.topic, msgs...); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := aSrc.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the other member to apply the new messages", func() bool {
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(DISTINCT msg_id) FROM effects WHERE msg_id = ANY($1)`, ids).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == len(ids)
	})
	took := time.Since(start)
	t.Logf("%d partitions (%v) handed over and their new messages applied %s after Close began (HeartbeatInterval %s, SessionTimeout %s)",
		len(moving), moving, took.Round(time.Millisecond), e.config().HeartbeatInterval, e.config().SessionTimeout)
	if took > handover {
		t.Errorf("the new messages of the closed member's partitions were applied %s after Close began, want within %s", took.Round(time.Millisecond), handover)
	}
}
