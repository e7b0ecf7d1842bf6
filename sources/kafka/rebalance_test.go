package kafka

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/jackc/pgx/v5"
)

// TestRebalance: two, then three consumers in one group while 100,000
// messages flow; one of them is killed in the middle of a batch (its
// transaction never commits, its batches are never settled). The effect
// table ends with exactly one row per message.
func TestRebalance(t *testing.T) {
	n := 100_000
	if testing.Short() {
		n = 20_000
	}
	e := newEnv(t, 6)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	// produce writes messages up to the given fraction of n while the
	// consumers run.
	next := 0
	produce := func(upto float64) {
		for end := int(upto * float64(n)); next < end; {
			to := min(next+5000, end)
			e.produce(next, to)
			next = to
		}
	}

	var killA atomic.Bool
	a, b := e.source(), e.source()
	wa := startWorkers(ctx, a, e.pool, 2, 500, func(*consumer.Batch) bool { return killA.Load() })
	wb := startWorkers(ctx, b, e.pool, 2, 500, nil)
	produce(0.3)

	c := e.source()
	wc := startWorkers(ctx, c, e.pool, 2, 500, nil)
	produce(0.5)
	waitFor(t, 30*time.Second, "the third consumer's assignment", func() bool { return len(c.Assignment()) > 0 })
	produce(0.7)

	// A dies in the middle of its next batch: effects written, never
	// committed, never settled. Then it leaves the group.
	killA.Store(true)
	produce(1)
	wa.wait(t)
	_ = a.Close()

	e.waitEffects(n, time.Minute)
	cancel()
	wb.wait(t)
	wc.wait(t)
	rows, distinct := e.effects()
	if rows != n || distinct != n {
		t.Fatalf("%d effect rows for %d distinct messages, want %d of each", rows, distinct, n)
	}
	if wc.batches == 0 {
		t.Errorf("the third consumer processed no batch")
	}
	t.Logf("%d messages; batches: A %d, B %d (fenced %d), C %d (fenced %d)",
		n, wa.batches, wb.batches, wb.fenced, wc.batches, wc.fenced)
}

// TestZombie: a consumer whose batch outlives its generation: the
// coordinator drops it from the group (it did not rejoin within
// RebalanceTimeout, since it still waits for its batch) and gives its
// partition to another member, which claims it and consumes. The zombie
// still believes its batch may commit; its commit is refused by the
// Postgres fence with ErrFenced and its effects roll back.
func TestZombie(t *testing.T) {
	e := newEnv(t, 1)
	e.produce(0, 100)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	quick := func(c *Config) {
		c.RebalanceTimeout = time.Second
		c.RevokeTimeout = 500 * time.Millisecond
	}
	a := e.source(quick)
	a.cfg.RevokeTimeout = time.Minute // longer than RebalanceTimeout, which New refuses: a zombie in the making
	old, err := a.Fetch(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	l := old.SourceData.(*lane)

	b := e.source(quick)
	wb := startWorkers(ctx, b, e.pool, 1, 50, nil)
	e.waitEffects(100, 30*time.Second)
	if row := e.storedOffsets()[0]; row[1] <= int64(l.gen.id) || row[0] != 100 {
		t.Fatalf("offsets row %v: want next offset 100 written by a generation after %d", row, l.gen.id)
	}
	a.mu.Lock()
	state := l.state
	a.mu.Unlock()
	if state != laneRevoking {
		t.Fatalf("the zombie's lane is in state %d, want revoking (its batch may still commit as far as it knows)", state)
	}

	err = process(ctx, a, e.pool, old, nil)
	if !errors.Is(err, consumer.ErrFenced) {
		t.Fatalf("zombie commit: got %v, want ErrFenced", err)
	}
	cancel()
	wb.wait(t)
	if rows, distinct := e.effects(); rows != 100 || distinct != 100 {
		t.Fatalf("%d effect rows for %d distinct messages, want 100 of each", rows, distinct)
	}
}

// TestZombieInPostgres: the Postgres fence on its own. A batch's
// BeforeCommit runs after a newer generation claimed its partition, while
// the zombie's own view still says it owns the partition.
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
	// Another member's claim in a later generation, as runGeneration makes it.
	claimed, _, err := a.store.claim(ctx, l.gen.id+1, []topicPartition{{l.topic, l.partition}})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	err = process(ctx, a, e.pool, old, nil)
	if !errors.Is(err, consumer.ErrFenced) {
		t.Fatalf("zombie commit: got %v, want ErrFenced", err)
	}
	if rows, _ := e.effects(); rows != 0 {
		t.Fatalf("%d effect rows from a fenced batch", rows)
	}
	if a := a.Assignment(); len(a) != 0 {
		t.Errorf("fenced partition still handed out: %v", a)
	}
	// An older generation's claim does not take the row back.
	if claimed, busy, err := a.store.claim(ctx, l.gen.id, []topicPartition{{l.topic, l.partition}}); err != nil || len(claimed) != 0 || len(busy) != 0 {
		t.Errorf("claim by an older generation: %v %v %v", claimed, busy, err)
	}
}

// TestCrashAfterPostgresCommit: a consumer commits a batch in Postgres and
// dies before settling it, so Kafka never hears of the commit. The next
// consumer of the group starts from the offset in Postgres: no second effect.
func TestCrashAfterPostgresCommit(t *testing.T) {
	e := newEnv(t, 1)
	e.produce(0, 50)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	a := e.source()
	// Four batches: the first three are settled, the fourth commits in
	// Postgres and then the consumer dies before Settle.
	var settled, committed int64
	for i := range 4 {
		b, err := a.Fetch(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range b.Messages {
			_, _, off, _ := Position(m)
			if _, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1, $2, $3)`, m.ID, m.Lane, off); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.BeforeCommit(ctx, tx, b, b.Messages); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		_, _, last, _ := Position(b.Messages[len(b.Messages)-1])
		committed = last + 1
		if i < 3 {
			if err := a.Settle(ctx, b, b.Messages, nil); err != nil {
				t.Fatal(err)
			}
			settled = committed
		}
	}
	time.Sleep(1200 * time.Millisecond) // let the Kafka committer run
	_ = a.Close()
	offs, err := e.kafka.CommittedOffsets(ctx, e.group, e.topic)
	if err != nil {
		t.Fatal(err)
	}
	if offs[0] > settled || settled >= committed {
		t.Fatalf("Kafka committed offset %d, settled up to %d, committed up to %d: the crash window was not exercised", offs[0], settled, committed)
	}
	if next := e.storedOffsets()[0][0]; next != committed {
		t.Fatalf("stored next offset %d, want %d", next, committed)
	}

	e.produce(50, 60)
	b := e.source()
	w := startWorkers(ctx, b, e.pool, 1, 10, nil)
	e.waitEffects(60, 30*time.Second)
	time.Sleep(300 * time.Millisecond) // a redelivery would show up by now
	cancel()
	w.wait(t)
	if rows, distinct := e.effects(); rows != 60 || distinct != 60 {
		t.Fatalf("%d effect rows for %d distinct messages, want 60 of each (Kafka had committed %d)", rows, distinct, offs[0])
	}
}

var _ = pgx.ErrNoRows
