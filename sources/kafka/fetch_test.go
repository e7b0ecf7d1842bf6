package kafka

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
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

// TestCompactedTopic: a compacted topic whose log has gaps where the
// cleaner removed records, inside batches and between them. Every record
// the broker still holds (as a franz-go consumer reads it) is applied once,
// and the stored offset reaches the end of the log.
func TestCompactedTopic(t *testing.T) {
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Skip("needs the in-process cluster, to compact on demand")
	}
	k := kafkatest.New(t)
	e := &env{t: t, kafka: k, topic: kafkatest.Name("accounts"), group: kafkatest.Name("ledger"), partitions: 1, pool: pgtest.NewPool(t)}
	if err := k.Fake().CreateTopic(e.topic, 1, map[string]string{"cleanup.policy": "compact"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL, lane text NOT NULL, off bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...), kgo.DefaultProduceTopic(e.topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for b := range 20 { // 20 batches of 5 records, 7 keys
		var recs []*kgo.Record
		for j := range 5 {
			i := b*5 + j
			id := fmt.Sprintf("v-%d", i)
			recs = append(recs, &kgo.Record{Key: []byte(fmt.Sprintf("acct-%d", i%7)), Value: []byte(id),
				Headers: []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte(id)}}})
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	k.Fake().Compact()

	// What the broker holds now, read by a client written by others.
	rd, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers()...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{e.topic: {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	end := e.endOffsets()[0]
	var want []string
	for last := int64(-1); last < end-1; {
		fs := rd.PollFetches(ctx)
		if err := fs.Err(); err != nil {
			t.Fatal(err)
		}
		for _, r := range fs.Records() {
			want = append(want, string(r.Value))
			last = r.Offset
		}
	}
	if len(want) >= 100 {
		t.Fatalf("compaction removed nothing: %d records", len(want))
	}

	h := &consumertest.Counter{}
	src := e.source()
	run := consumertest.Start(e.engine(src, h))
	e.waitAtEnd(src, len(want))
	run.Stop(t)
	e.checkApplied(want, h)
	t.Logf("%d of 100 records left after compaction, log end %d", len(want), end)
}
