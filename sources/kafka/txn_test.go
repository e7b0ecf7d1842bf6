package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Tests of records written by transactional producers (franz-go's kgo):
// aborted transactions and the control records (commit and abort markers)
// that close every transaction.

// txnLog produces rounds of overlapping transactions of several
// transactional producers, interleaved with plain records, and remembers
// what it wrote.
type txnLog struct {
	e         *env
	producers []*kgo.Client
	plain     *kgo.Client
	committed []string // idempotency keys of records of committed transactions
	aborted   []string // ... of aborted transactions
	plains    []string // ... of plain records
	commits   int      // committed transactions
	aborts    int      // aborted transactions
}

func newTxnLog(e *env, producers int) *txnLog {
	e.t.Helper()
	l := &txnLog{e: e}
	opts := []kgo.Opt{
		kgo.SeedBrokers(e.kafka.Brokers()...), kgo.DefaultProduceTopic(e.topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	}
	for i := range producers {
		cl, err := kgo.NewClient(append(opts, kgo.TransactionalID(fmt.Sprintf("%s-txn-%d", e.topic, i)))...)
		if err != nil {
			e.t.Fatal(err)
		}
		e.t.Cleanup(cl.Close)
		l.producers = append(l.producers, cl)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(cl.Close)
	l.plain = cl
	return l
}

// round opens one transaction per producer, writes one record of each to
// every partition, and plain records to every partition while they are
// open, then ends them in turn: producer p's transaction of round r commits
// when r+p is even and aborts otherwise. So every partition ends with the
// control records of the round.
func (l *txnLog) round(r int) {
	t := l.e.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	keys := make([][]string, len(l.producers))
	for p, cl := range l.producers {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for part := range l.e.partitions {
			key := fmt.Sprintf("r%d-p%d-%d", r, p, part)
			keys[p] = append(keys[p], key)
			rec := &kgo.Record{Partition: int32(part), Value: []byte("txn " + key),
				Headers: []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte(key)}}}
			if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if p == 0 {
			for part := range l.e.partitions {
				key := fmt.Sprintf("r%d-plain-%d", r, part)
				l.plains = append(l.plains, key)
				rec := &kgo.Record{Partition: int32(part), Value: []byte("plain " + key),
					Headers: []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte(key)}}}
				if err := l.plain.ProduceSync(ctx, rec).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for p, cl := range l.producers {
		commit := (r+p)%2 == 0
		end := kgo.TryAbort
		if commit {
			end = kgo.TryCommit
		}
		if err := cl.EndTransaction(ctx, end); err != nil {
			t.Fatal(err)
		}
		if commit {
			l.committed = append(l.committed, keys[p]...)
			l.commits++
		} else {
			l.aborted = append(l.aborted, keys[p]...)
			l.aborts++
		}
	}
}

// endOffsets returns the end (high watermark) of every partition of e's
// topic.
func (e *env) endOffsets() map[int]int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl := &kafkago.Client{Addr: kafkago.TCP(e.kafka.Brokers()...), Transport: &kafkago.Transport{}}
	defer cl.Transport.(*kafkago.Transport).CloseIdleConnections()
	req := &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{}}
	for p := range e.partitions {
		req.Topics[e.topic] = append(req.Topics[e.topic], kafkago.LastOffsetOf(p))
	}
	resp, err := cl.ListOffsets(ctx, req)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[e.topic] {
		if p.Error != nil {
			e.t.Fatal(p.Error)
		}
		out[p.Partition] = p.LastOffset
	}
	return out
}

// appliedIDs returns the msg_id of every effect row, sorted.
func (e *env) appliedIDs() []string {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT msg_id FROM effects ORDER BY msg_id`)
	if err != nil {
		e.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// atEnd reports whether the stored offset of every partition, and the
// source's commit point (Lag 0), reached the end of its log; what says
// where they are.
func (e *env) atEnd(s *Source) (ok bool, what string) {
	e.t.Helper()
	end, stored, lag := e.endOffsets(), e.storedOffsets(), s.Lag()
	ok = len(lag) == e.partitions
	for p := range e.partitions {
		name := laneName(e.topic, p)
		if stored[p][0] != end[p] || lag[name] != 0 {
			ok = false
		}
	}
	return ok, fmt.Sprintf("end offsets %v, stored %v, lag %v", end, stored, lag)
}

// checkApplied fails t unless the effects are exactly want, once each.
func (e *env) checkApplied(want []string, h *consumertest.Counter) {
	e.t.Helper()
	got := e.appliedIDs()
	want = slices.Clone(want)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		var extra, missing []string
		for _, id := range got {
			if _, found := slices.BinarySearch(want, id); !found {
				extra = append(extra, id)
			}
		}
		for _, id := range want {
			if _, found := slices.BinarySearch(got, id); !found {
				missing = append(missing, id)
			}
		}
		e.t.Fatalf("%d effects, want %d; %d unexpected (%s), %d missing (%s); %s",
			len(got), len(want), len(extra), strings.Join(extra, " "), len(missing), strings.Join(missing, " "), h)
	}
}

// waitAtEnd waits until every partition's stored offset and commit point
// reached the end of its log and at least n messages were applied.
func (e *env) waitAtEnd(s *Source, n int) {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ok, what := e.atEnd(s)
		_, applied := e.effects()
		if ok && applied >= n {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for the partitions' ends with %d effects (%d so far): %s", n, applied, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestReadCommittedTransactions: three transactional producers write
// overlapping transactions to three partitions, half committed and half
// aborted, with plain records between them. The source applies exactly the
// committed and the plain records, never an aborted record or a control
// record, and its stored offsets reach the end of every partition (past the
// last control record), also across a restart in the middle.
func TestReadCommittedTransactions(t *testing.T) {
	e := newEnv(t, 3)
	log := newTxnLog(e, 3)
	for r := range 4 {
		log.round(r)
	}
	h := &consumertest.Counter{}
	src := e.source()
	run := consumertest.Start(e.engine(src, h))
	e.waitAtEnd(src, len(log.committed)+len(log.plains))
	run.Stop(t)
	_ = src.Close()
	e.checkApplied(append(slices.Clone(log.committed), log.plains...), h)

	// A new source of the same group takes over where the first stopped.
	for r := 4; r < 8; r++ {
		log.round(r)
	}
	if log.commits < 9 || log.aborts < 9 {
		t.Fatalf("only %d committed and %d aborted transactions", log.commits, log.aborts)
	}
	h2 := &consumertest.Counter{}
	src = e.source()
	run = consumertest.Start(e.engine(src, h2))
	e.waitAtEnd(src, len(log.committed)+len(log.plains))
	run.Stop(t)
	_ = src.Close()
	e.checkApplied(append(slices.Clone(log.committed), log.plains...), h2)

	// A consumer dies in the middle: batches of 4, and from the fourth on
	// every batch hangs until the consumer stops, so those never commit.
	for r := 8; r < 12; r++ {
		log.round(r)
	}
	h3 := &consumertest.Counter{}
	src = e.source()
	var batches atomic.Int32
	hung := make(chan struct{})
	var once sync.Once
	c := e.engine(src, h3, func(cfg *consumer.Config) {
		cfg.BatchSize = 4
		cfg.ShutdownTimeout = 200 * time.Millisecond
		cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
			if batches.Add(1) > 3 {
				once.Do(func() { close(hung) })
				<-ctx.Done()
				return ctx.Err()
			}
			return insertEffects(ctx, tx, msgs)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-hung:
	case <-time.After(2 * time.Minute):
		t.Fatalf("no fourth batch; %s", h3)
	}
	cancel()
	if err := <-done; err != nil && !errors.Is(err, consumer.ErrShutdownTimeout) {
		t.Fatalf("Run: %v", err)
	}
	_ = src.Close()
	if _, applied := e.effects(); applied >= len(log.committed)+len(log.plains) {
		t.Fatalf("the third consumer applied everything (%d) before it died", applied)
	}
	h4 := &consumertest.Counter{}
	src = e.source()
	run = consumertest.Start(e.engine(src, h4))
	e.waitAtEnd(src, len(log.committed)+len(log.plains))
	run.Stop(t)
	e.checkApplied(append(slices.Clone(log.committed), log.plains...), h4)
	if log.commits < 9 || log.aborts < 9 {
		t.Fatalf("only %d committed and %d aborted transactions", log.commits, log.aborts)
	}
	t.Logf("%d committed and %d aborted transactions; %d committed, %d aborted and %d plain records; first %s; second %s; third (died) %s; fourth %s",
		log.commits, log.aborts, len(log.committed), len(log.aborted), len(log.plains), h, h2, h3, h4)
}

// TestReadCommittedRestartMidTransaction: the consumer is stopped while a
// transaction is still open, with records of it and of a plain producer
// after its start. The open transaction holds the read-committed position
// back; once it aborts, a new source of the group applies the plain records
// and none of the aborted ones, and reaches the end of the partition.
func TestReadCommittedRestartMidTransaction(t *testing.T) {
	e := newEnv(t, 1)
	log := newTxnLog(e, 1)
	log.round(0) // committed
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := log.producers[0]
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produce := func(c *kgo.Client, key string) {
		rec := &kgo.Record{Value: []byte(key), Headers: []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte(key)}}}
		if err := c.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produce(cl, "open-1")
	produce(log.plain, "plain-after-open")
	produce(cl, "open-2")

	h := &consumertest.Counter{}
	src := e.source()
	run := consumertest.Start(e.engine(src, h))
	e.waitEffects(len(log.committed)+len(log.plains), time.Minute)
	run.Stop(t)
	_ = src.Close()
	e.checkApplied(append(slices.Clone(log.committed), log.plains...), h)

	if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	h2 := &consumertest.Counter{}
	src = e.source()
	run = consumertest.Start(e.engine(src, h2))
	want := append(slices.Clone(log.committed), log.plains...)
	want = append(want, "plain-after-open")
	e.waitAtEnd(src, len(want))
	run.Stop(t)
	e.checkApplied(want, h2)
}

// TestReadUncommittedTransactions: with Config.ReadUncommitted the records
// of aborted transactions are delivered too, but control records never
// are, and the stored offsets still reach the end of every partition.
func TestReadUncommittedTransactions(t *testing.T) {
	e := newEnv(t, 2)
	log := newTxnLog(e, 2)
	for r := range 10 {
		log.round(r)
	}
	h := &consumertest.Counter{}
	src := e.source(func(c *Config) { c.ReadUncommitted = true })
	run := consumertest.Start(e.engine(src, h))
	all := append(append(slices.Clone(log.committed), log.aborted...), log.plains...)
	e.waitAtEnd(src, len(all))
	run.Stop(t)
	e.checkApplied(all, h)
}

// TestOnlyAbortedTransactions: a partition holding nothing but aborted
// transactions and their markers. Nothing is applied, no batch is ever
// handed out, and the stored offset still reaches the end of the log: the
// source neither spins on the dropped records nor fetches them again after
// a restart.
func TestOnlyAbortedTransactions(t *testing.T) {
	e := newEnv(t, 1)
	log := newTxnLog(e, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := log.producers[0]
	for i := range 20 {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for j := range 3 {
			key := fmt.Sprintf("aborted-%d-%d", i, j)
			rec := &kgo.Record{Value: []byte(key), Headers: []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte(key)}}}
			if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 2 { // the second source starts where the first stored
		h := &consumertest.Counter{}
		src := e.source()
		run := consumertest.Start(e.engine(src, h))
		e.waitAtEnd(src, 0)
		run.Stop(t)
		_ = src.Close()
		if tot := h.Total(); tot.Applied+tot.Duplicate+tot.Parked != 0 {
			t.Fatalf("round %d: %s, want nothing", round, h)
		}
	}
	e.checkApplied(nil, &consumertest.Counter{})
	if end := e.endOffsets()[0]; end != 80 {
		t.Errorf("the partition ends at %d, want 80 (60 records and 20 markers)", end)
	}

	// With Kafka's offsets as the only position, the group's committed
	// offset moves past the dropped records too.
	h := &consumertest.Counter{}
	only := e.source(func(c *Config) { c.KafkaOffsetsOnly = true; c.Group = e.group + "-kafka" })
	run := consumertest.Start(e.engine(only, h))
	waitFor(t, time.Minute, "the Kafka offset at the end of the partition", func() bool {
		offs, err := e.kafka.CommittedOffsets(context.Background(), e.group+"-kafka", e.topic)
		if err != nil {
			t.Fatal(err)
		}
		return offs[0] == 80 && only.Lag()[laneName(e.topic, 0)] == 0
	})
	run.Stop(t)
	if tot := h.Total(); tot.Applied+tot.Duplicate+tot.Parked != 0 {
		t.Fatalf("KafkaOffsetsOnly: %s, want nothing", h)
	}
}
