package franz

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
)

// produceTxn writes n records with ids prefix-0.. in one transaction of a
// transactional producer, committed or aborted.
func (e *env) produceTxn(prefix string, n int, commit bool) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers()...), kgo.TransactionalID(prefix+"-"+e.topic),
		kgo.DefaultProduceTopic(e.topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer p.Close()
	if err := p.BeginTransaction(); err != nil {
		e.t.Fatal(err)
	}
	for i := range n {
		r := &kgo.Record{Value: []byte("v"), Headers: []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte(prefix + "-" + strconv.Itoa(i))}}}
		if err := p.ProduceSync(ctx, r).FirstErr(); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := p.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		e.t.Fatal(err)
	}
}

// TestReadCommitted: by default only the records of committed
// transactions (and of producers without transactions) are delivered;
// with ReadUncommitted the aborted ones are too.
func TestReadCommitted(t *testing.T) {
	for _, tc := range []struct {
		name        string
		uncommitted bool
		want        int
	}{{"read-committed", false, 15}, {"read-uncommitted", true, 25}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produceTxn("committed", 10, true)
			e.produceTxn("aborted", 10, false)
			e.produce(0, 5) // no transaction
			h := &consumertest.Counter{}
			r := consumertest.Start(e.engine(e.source(func(c *Config) { c.ReadUncommitted = tc.uncommitted }), h))
			e.waitEffects(tc.want, 30*time.Second)
			// The five plain records come after the aborted ones: once they
			// are stored, every earlier record was delivered or dropped.
			waitFor(t, 30*time.Second, "the last record's offset stored", func() bool { return e.storedOffsets()[0][0] >= 24 })
			r.Stop(t)
			var aborted int
			if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM effects WHERE msg_id LIKE 'aborted-%'`).Scan(&aborted); err != nil {
				t.Fatal(err)
			}
			if rows, _ := e.effects(); rows != tc.want {
				t.Errorf("%d effects (%d of aborted records), want %d", rows, aborted, tc.want)
			}
			if !tc.uncommitted && aborted != 0 {
				t.Errorf("%d records of an aborted transaction applied", aborted)
			}
		})
	}
}

// TestSwitchFromKafkaGo: a group consumed by sources/kafka moves to
// sources/franz and goes on from the offsets sources/kafka stored in the
// shared table: nothing is consumed twice.
func TestSwitchFromKafkaGo(t *testing.T) {
	e := newEnv(t, 2)
	e.produce(0, 100)
	old, err := kafka.New(e.pool, kafka.Config{
		Brokers: e.kafka.Brokers(), Group: e.group, Topics: []string{e.topic},
		MaxWait: 100 * time.Millisecond, SessionTimeout: 6 * time.Second, RebalanceTimeout: 5 * time.Second,
		RevokeTimeout: 2 * time.Second, JoinGroupBackoff: 200 * time.Millisecond, Logger: testLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	h := &consumertest.Counter{}
	r := consumertest.Start(e.engine(old, h))
	e.waitEffects(100, 30*time.Second)
	waitFor(t, 30*time.Second, "sources/kafka's offsets stored", func() bool {
		o := e.storedOffsets()
		return o[0][0] == 50 && o[1][0] == 50
	})
	r.Stop(t)
	_ = old.Close()

	e.produce(100, 200)
	r = consumertest.Start(e.engine(e.source(), h))
	e.waitEffects(200, 30*time.Second)
	waitFor(t, 30*time.Second, "sources/franz's offsets stored", func() bool {
		o := e.storedOffsets()
		return o[0][0] == 100 && o[1][0] == 100
	})
	r.Stop(t)
	if rows, distinct := e.effects(); rows != 200 || distinct != 200 {
		t.Fatalf("%d effect rows for %d distinct messages, want 200 of each; %s", rows, distinct, h)
	}
	if d := h.Total().Duplicate; d != 0 {
		t.Errorf("%d duplicates: sources/franz consumed again what sources/kafka had stored", d)
	}
}
