package kafka

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/internal/pgtest"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Tests of the partition fetcher's error paths.

// TestLeaderMoves: the partitions' leaders move to other brokers while the
// consumer runs. The fetchers find the new leaders (NotLeaderForPartition
// makes them look again) and every message is applied once.
func TestLeaderMoves(t *testing.T) {
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Skip("needs the in-process cluster, to move partition leaders")
	}
	const n, partitions = 3000, 2
	k := kafkatest.New(t, kfake.NumBrokers(3))
	e := &env{t: t, kafka: k, topic: kafkatest.Name("orders"), group: kafkatest.Name("ledger"), partitions: partitions, pool: pgtest.NewPool(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := k.CreateTopic(ctx, e.topic, partitions); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL, lane text NOT NULL, off bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	e.produce(0, n/3)
	h := &consumertest.Counter{}
	src := e.source()
	run := consumertest.Start(e.engine(src, h))
	e.waitEffects(n/3, time.Minute)
	moved := map[int32]int32{}
	for p := range int32(partitions) {
		from := k.Fake().LeaderFor(e.topic, p)
		to := (from + 1) % 3
		if err := k.Fake().MoveTopicPartition(e.topic, p, to); err != nil {
			t.Fatal(err)
		}
		k.Fake().SetFollowers(e.topic, p, nil) // the old leader no longer serves fetches

		moved[p] = to
	}
	e.produce(n/3, n)
	e.waitEffects(n, 2*time.Minute)
	waitFor(t, time.Minute, "the stored offsets at the end of the partitions", func() bool {
		ok, _ := e.atEnd(src)
		return ok
	})
	run.Stop(t)
	if rows, distinct := e.effects(); rows != n || distinct != n {
		t.Fatalf("%d effect rows for %d distinct messages, want %d of each; %s", rows, distinct, n, h)
	}
	for p, to := range moved {
		if got := k.Fake().LeaderFor(e.topic, p); got != to {
			t.Errorf("partition %d is led by broker %d, moved to %d", p, got, to)
		}
	}
}

// TestRecordsDeletedBeforePosition: the stored position of a partition lies
// before the start of its log (retention, or DeleteRecords, removed the
// records). The fetcher gets OffsetOutOfRange, moves on to the first
// offset the log still has, and the consumer applies every record from
// there to the end.
func TestRecordsDeletedBeforePosition(t *testing.T) {
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Skip("needs the in-process cluster, to delete records")
	}
	e := newEnv(t, 1)
	e.produce(0, 10)
	h := &consumertest.Counter{}
	src := e.source()
	run := consumertest.Start(e.engine(src, h))
	waitFor(t, time.Minute, "the stored offset at 10", func() bool { return e.storedOffsets()[0][0] == 10 })
	run.Stop(t)
	_ = src.Close()

	e.produce(10, 100)
	if err := e.kafka.Fake().DeleteRecords(e.topic, 0, 50); err != nil {
		t.Fatal(err)
	}
	src = e.source()
	run = consumertest.Start(e.engine(src, h))
	e.waitAtEnd(src, 60)
	run.Stop(t)
	var want []string
	for i := range 10 {
		want = append(want, fmt.Sprintf("k-%d", i))
	}
	for i := 50; i < 100; i++ {
		want = append(want, fmt.Sprintf("k-%d", i))
	}
	e.checkApplied(want, h)
}

// TestCloseDuringLongFetch: Close does not wait for the fetches in
// flight: with a MaxWait of five minutes and nothing to fetch, every
// partition's fetch waits at the broker, and Close still returns long
// before any of them would end.
func TestCloseDuringLongFetch(t *testing.T) {
	e := newEnv(t, 2)
	e.produce(0, 10)
	h := &consumertest.Counter{}
	src := e.source(func(c *Config) { c.MaxWait = 5 * time.Minute })
	run := consumertest.Start(e.engine(src, h))
	waitFor(t, time.Minute, "the stored offsets at the end of the partitions", func() bool {
		ok, _ := e.atEnd(src)
		return ok
	})
	run.Stop(t)
	closed := make(chan struct{})
	go func() {
		_ = src.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(2 * time.Minute):
		t.Fatal("Close waited for the fetches in flight")
	}
}
