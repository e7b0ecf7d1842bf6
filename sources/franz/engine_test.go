package franz

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5"
)

// Tests that run the source under the consumer engine with the idset strategy.

// insertEffects is a BatchHandler writing one effect row per message.
func insertEffects(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
	ids := make([]string, len(msgs))
	lanes := make([]string, len(msgs))
	offs := make([]int64, len(msgs))
	for i, m := range msgs {
		ids[i], lanes[i] = m.DedupeKey.ID, m.Lane
		var ok bool
		if _, _, offs[i], ok = Position(m); !ok {
			_, _, offs[i], _ = kafka.Position(m) // TestSwitchFromKafkaGo
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id, lane, off) SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`, ids, lanes, offs)
	return err
}

// engine makes a migrated consumer over src with the idset strategy.
func (e *env) engine(src consumer.Source, hooks *consumertest.Counter) *consumer.Consumer {
	e.t.Helper()
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		e.t.Fatal(err)
	}
	return consumertest.NewConsumer(e.t, e.pool, src, consumer.Config{
		Name:            "ledger",
		Strategy:        strategy,
		BatchHandler:    insertEffects,
		BatchSize:       500,
		RetryBackoff:    20 * time.Millisecond,
		MaxRetryBackoff: 50 * time.Millisecond,
		Hooks:           []consumer.Hook{hooks},
		Logger:          testLogger(),
	})
}

// effects returns the effect rows and the distinct messages they are for.
func (e *env) effects() (rows, distinct int) {
	e.t.Helper()
	err := e.pool.QueryRow(context.Background(),
		`SELECT count(*), count(DISTINCT (lane, off)) FROM effects`).Scan(&rows, &distinct)
	if err != nil {
		e.t.Fatal(err)
	}
	return rows, distinct
}

// waitEffects waits until n distinct messages have an effect, failing
// when none appeared for stall: it waits on progress, not wall time.
func (e *env) waitEffects(n int, stall time.Duration) {
	e.t.Helper()
	last, since := -1, time.Now()
	for {
		rows, d := e.effects()
		if d >= n {
			return
		}
		if d > last {
			last, since = d, time.Now()
		} else if time.Since(since) > stall {
			e.t.Fatalf("waiting for %d distinct effects: stuck at %d (%d rows) for %s", n, d, rows, stall)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// storedOffsets returns partition → (next offset or -1, generation).
func (e *env) storedOffsets() map[int][2]int64 {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(),
		`SELECT partition, coalesce(next_offset, -1), generation FROM effectively.kafka_offsets WHERE group_id = $1 AND topic = $2`, e.group, e.topic)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int][2]int64{}
	for rows.Next() {
		var p int
		var next, gen int64
		if err := rows.Scan(&p, &next, &gen); err != nil {
			e.t.Fatal(err)
		}
		out[p] = [2]int64{next, gen}
	}
	if rows.Err() != nil {
		e.t.Fatal(rows.Err())
	}
	return out
}

// TestEngineResume: a consumer is stopped mid-stream while another of the
// same group, under franz-go's default cooperative-sticky balancer, takes
// the partitions over; every message is applied exactly once, and the
// offsets table holds the end of every partition.
func TestEngineResume(t *testing.T) {
	const n = 6000
	e := newEnv(t, 3)
	e.produce(0, n/2)
	h := &consumertest.Counter{}
	firstSrc := e.source()
	first := consumertest.Start(e.engine(firstSrc, h))
	e.waitEffects(n/4, 30*time.Second)
	e.produce(n/2, n)
	secondSrc := e.source()
	second := consumertest.Start(e.engine(secondSrc, h))
	waitFor(t, time.Minute, "the second source's share of the partitions", func() bool { return len(secondSrc.Assignment()) > 0 })
	first.Stop(t)
	_ = firstSrc.Close() // leaves the group: the second consumer gets every partition
	e.waitEffects(n, 30*time.Second)
	waitFor(t, 30*time.Second, "the offsets table to hold every partition's end", func() bool {
		for p := range 3 {
			if e.storedOffsets()[p][0] != n/3 {
				return false
			}
		}
		return true
	})
	second.Stop(t)
	if rows, distinct := e.effects(); rows != n || distinct != n {
		t.Fatalf("%d effect rows for %d distinct messages, want %d of each; %s", rows, distinct, n, h)
	}
	// Lag is as of each partition's last fetch, or its last look at the
	// end of the log: it reaches 0 for all three.
	waitFor(t, 30*time.Second, "Lag to report the three partitions at 0", func() bool {
		lag := secondSrc.Lag()
		for _, l := range lag {
			if l != 0 {
				return false
			}
		}
		return len(lag) == 3
	})
}

// TestZombieInPostgres: the Postgres fence on its own. A batch's
// BeforeCommit runs after a newer generation claimed its partition, while
// the zombie's own view still says it owns the partition: it is refused
// with consumer.ErrFenced and leaves no effect.
func TestZombieInPostgres(t *testing.T) {
	e := newEnv(t, 1)
	e.produce(0, 20)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a := e.source()
	old, err := a.Fetch(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	l := old.SourceData.(*lane)
	// Another member's claim in a later generation.
	claimed, _, err := a.store.Claim(ctx, l.gen+1, []TopicPartition{l.tp})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	c := e.engine(a, &consumertest.Counter{})
	_ = c
	err = pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if err := insertEffects(ctx, tx, old.Messages); err != nil {
			return err
		}
		return a.BeforeCommit(ctx, tx, old, old.Messages)
	})
	if !errors.Is(err, consumer.ErrFenced) {
		t.Fatalf("zombie commit: got %v, want ErrFenced", err)
	}
	if err := a.Settle(ctx, old, nil, nil); err != nil {
		t.Fatalf("Settle of a fenced batch: %v", err)
	}
	if rows, _ := e.effects(); rows != 0 {
		t.Fatalf("%d effect rows from a fenced batch", rows)
	}
	if got := a.Assignment(); len(got) != 0 {
		t.Errorf("fenced partition still handed out: %v", got)
	}
}

// TestKafkaOffsetsOnly: without the offsets table, the offsets committed
// to Kafka are the position: a second source of the group goes on where
// the first one's commits left off, and writes no offsets row.
func TestKafkaOffsetsOnly(t *testing.T) {
	e := newEnv(t, 2)
	e.produce(0, 100)
	h := &consumertest.Counter{}
	only := func(c *Config) { c.KafkaOffsetsOnly = true }
	first := e.source(only)
	r := consumertest.Start(e.engine(first, h))
	e.waitEffects(100, 30*time.Second)
	waitFor(t, 30*time.Second, "the offsets committed to Kafka", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got, err := e.kafka.CommittedOffsets(ctx, e.group, e.topic)
		return err == nil && got[0] == 50 && got[1] == 50
	})
	r.Stop(t)
	_ = first.Close()
	e.produce(100, 120)
	r = consumertest.Start(e.engine(e.source(only), h))
	e.waitEffects(120, 30*time.Second)
	r.Stop(t)
	if rows, distinct := e.effects(); rows != 120 || distinct != 120 {
		t.Fatalf("%d effect rows for %d distinct messages, want 120 of each; %s", rows, distinct, h)
	}
	if d := h.Total().Duplicate; d != 0 {
		t.Errorf("%d duplicates: the second source did not start from the offsets in Kafka", d)
	}
	var table bool
	if err := e.pool.QueryRow(context.Background(), `SELECT to_regclass('effectively.kafka_offsets') IS NOT NULL`).Scan(&table); err != nil {
		t.Fatal(err)
	}
	if table {
		if rows := e.storedOffsets(); len(rows) != 0 {
			t.Errorf("offsets rows %v written with KafkaOffsetsOnly", rows)
		}
	}
}

// TestSmallPartitionBuffer: partitions whose buffer fills are paused in
// the client and resumed as the consumer takes their records, again and
// again; every record is applied once.
func TestSmallPartitionBuffer(t *testing.T) {
	e := newEnv(t, 2)
	e.produce(0, 2000)
	h := &consumertest.Counter{}
	src := e.source(func(c *Config) { c.PartitionBuffer = 8 })
	r := consumertest.Start(e.engine(src, h))
	e.waitEffects(2000, 30*time.Second)
	r.Stop(t)
	if rows, distinct := e.effects(); rows != 2000 || distinct != 2000 {
		t.Fatalf("%d effect rows for %d distinct messages, want 2000 of each; %s", rows, distinct, h)
	}
}
