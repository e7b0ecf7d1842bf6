package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func msg(key, id string) Message {
	return Message{Sink: "s", Key: []byte(key), Value: []byte(id), ID: id}
}

// TestLateCommitAndOpenTx: a transaction left open holds back only the
// key it emitted to; rows of later transactions on other keys go out;
// when it commits late (its rows are older than ones already published)
// it is published, and its key's later emit, which waited for it, after it.
func TestLateCommitAndOpenTx(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	ctx := context.Background()
	sink := newMemSink()
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}})

	open, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	if err := o.Emit(ctx, open, msg("a", "a1")); err != nil {
		t.Fatal(err)
	}
	emit(t, db, o, msg("b", "b1"))
	sink.waitFor(t, 2*time.Minute, "b1 while a's transaction is open", hasIDs("b1"))

	// A later emit to a waits for the open transaction's counter row.
	later := make(chan error, 1)
	go func() {
		later <- pgxBegin(ctx, db, func(ctx context.Context, tx txLike) error { return o.Emit(ctx, tx, msg("a", "a2")) })
	}()
	emit(t, db, o, msg("b", "b2"))
	sink.waitFor(t, 2*time.Minute, "b2 while a is blocked", hasIDs("b2"))
	select {
	case err := <-later:
		t.Fatalf("an emit to a key held by an open transaction did not wait (err %v)", err)
	default:
	}
	for _, m := range sink.messages() {
		if strings.HasPrefix(m.ID, "a") {
			t.Fatalf("%s published before its transaction committed", m.ID)
		}
	}
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-later; err != nil {
		t.Fatal(err)
	}
	got := sink.waitFor(t, 2*time.Minute, "a1 and a2", hasIDs("a1", "a2"))
	if o := firstOrder(got)["a"]; strings.Join(o, ",") != "a1,a2" {
		t.Fatalf("key a published as %v, want a1,a2", o)
	}
}

// TestCrashBetweenPublishAndMark: a relay that dies after publishing and
// before marking leaves the rows unpublished; the next relay publishes
// them again, with the same IDs.
func TestCrashBetweenPublishAndMark(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	emit(t, db, o, msg("k", "m1"), msg("k", "m2"), msg("j", "n1"))
	sink := newMemSink()
	var crashed atomic.Bool
	_, run := startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, LeaseTTL: time.Second,
		afterPublish: func([]row) error {
			crashed.Store(true)
			return errCrash
		}})
	<-run.done
	if !errors.Is(run.err, errCrash) {
		t.Fatalf("Run returned %v, want the simulated crash", run.err)
	}
	if !crashed.Load() || len(sink.messages()) != 3 {
		t.Fatalf("before the crash the sink got %v", ids(sink.messages()))
	}
	waitRows(t, db, 5*time.Second, 3, `SELECT count(*) FROM effectively.outbox WHERE published_at IS NULL`)

	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}})
	got := sink.waitFor(t, 2*time.Minute, "the republish", func(m []Message) bool { return len(m) >= 6 })
	count := map[string]int{}
	for _, m := range got {
		count[m.ID]++
	}
	if count["m1"] != 2 || count["m2"] != 2 || count["n1"] != 2 {
		t.Fatalf("deliveries per ID: %v", count)
	}
	if o := firstOrder(got)["k"]; strings.Join(o, ",") != "m1,m2" {
		t.Fatalf("order %v", o)
	}
	waitRows(t, db, 10*time.Second, 0, `SELECT count(*) FROM effectively.outbox WHERE published_at IS NULL`)
}

// TestTwoRelaysKeepKeyOrder: emitters on many keys while two relays run,
// one of them stopped and started again: every message is published at
// least once and each key's first deliveries are in commit order.
func TestTwoRelaysKeepKeyOrder(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	sink := newMemSink()
	var byFirst, bySecond countingSink
	byFirst.Sink, bySecond.Sink = sink, sink
	cfg := RelayConfig{Sinks: map[string]Sink{"s": &byFirst}, LeaseTTL: time.Second, BatchSize: 20}
	first, _ := startRelay(t, db, cfg)
	cfg2 := cfg
	cfg2.Sinks = map[string]Sink{"s": &bySecond}
	r2, second := startRelay(t, db, cfg2)
	waitUntil(t, 2*time.Minute, "both relays to hold partitions", func() bool {
		p1, _ := first.held()
		p2, _ := r2.held()
		return len(p1) > 0 && len(p2) > 0
	})

	// Commit order per key, as the emitters see it: emitters of one key
	// serialize on its counter row from their Emit to their commit, so the
	// order in which their Emit calls return is the order they commit in.
	// (The seq column is not: the cleanup deletes the counter of a key with
	// nothing waiting, and its next message starts again at 1.)
	const keys, perKey, writers = 20, 30, 4
	var wg sync.WaitGroup
	var mu sync.Mutex
	want := map[string][]string{}
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range keys * perKey / writers {
				n := w*keys*perKey/writers + i
				k := fmt.Sprintf("k%d", n%keys)
				id := fmt.Sprintf("%s-%d", k, n)
				err := pgxBegin(context.Background(), db, func(ctx context.Context, tx txLike) error {
					if err := o.Emit(ctx, tx, msg(k, id)); err != nil {
						return err
					}
					mu.Lock()
					want[k] = append(want[k], id)
					mu.Unlock()
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	sink.waitFor(t, 2*time.Minute, "both relays to publish", func([]Message) bool {
		return byFirst.n.Load() > 0 && bySecond.n.Load() > 0
	})
	if err := second.stop(); err != nil {
		t.Fatal(err)
	}
	startRelay(t, db, cfg)
	wg.Wait()
	waitRows(t, db, 60*time.Second, 0, `SELECT count(*) FROM effectively.outbox WHERE published_at IS NULL`)

	got := firstOrder(sink.messages())
	if len(want) != keys {
		t.Fatalf("%d keys in the outbox", len(want))
	}
	for k, w := range want {
		if strings.Join(got[k], ",") != strings.Join(w, ",") {
			t.Fatalf("key %s: first deliveries %v, commit order %v", k, got[k], w)
		}
	}
}

// TestFrozenRelay: a relay frozen after reading its rows and before
// publishing them wakes after its lease has gone to another relay, which
// has published them: it publishes nothing, and its marks are fenced.
func TestFrozenRelay(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	emit(t, db, o, msg("k", "m1"), msg("k", "m2"))
	frozen, thaw := make(chan struct{}), make(chan struct{})
	var once sync.Once
	sleepy := newMemSink()
	r1, run1 := startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sleepy}, LeaseTTL: time.Second,
		beforeCheck: func() {
			once.Do(func() { close(frozen); <-thaw })
		}})
	<-frozen
	parts, gens := r1.held()
	awake := newMemSink()
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": awake}, LeaseTTL: time.Second})
	awake.waitFor(t, 2*time.Minute, "the other relay to publish", hasIDs("m1", "m2"))
	close(thaw)
	// Run returns only once the frozen pass is over.
	if err := run1.stop(); err != nil {
		t.Fatal(err)
	}
	if got := sleepy.messages(); len(got) != 0 {
		t.Fatalf("the frozen relay published %v after its lease ended", ids(got))
	}
	// Marks by the stale generation change nothing.
	emit(t, db, o, msg("z", "z1"))
	var id int64
	if err := db.QueryRow(context.Background(), `SELECT id FROM effectively.outbox WHERE msg_id = 'z1'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	n, err := r1.settle(context.Background(), []outcome{{id: id, kind: outPark, err: "stale"}}, parts, gens)
	if err != nil || n != 0 {
		t.Fatalf("a settle under a lost lease changed %d rows (%v)", n, err)
	}
	awake.waitFor(t, 2*time.Minute, "z1", hasIDs("z1"))
}

// TestParkHoldsBackItsKey: a message refused for good is parked with the
// reason and holds back its key's later messages, not other keys'; a
// transient failure is retried; after a redrive the key goes on, in order.
func TestParkHoldsBackItsKey(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	sink := newMemSink()
	sink.refuse["a2"] = Permanent(errors.New("message too large"))
	sink.failTimes["b1"] = 2
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}})
	emit(t, db, o, msg("a", "a1"), msg("a", "a2"), msg("a", "a3"), msg("b", "b1"), msg("b", "b2"),
		Message{Sink: "nowhere", Key: []byte("c"), ID: "c1"})
	sink.waitFor(t, 2*time.Minute, "a1, b1, b2", hasIDs("a1", "b1", "b2"))
	waitRows(t, db, 10*time.Second, 2, `SELECT count(*) FROM effectively.outbox WHERE parked_at IS NOT NULL`)
	parked, err := o.Parked(context.Background(), db, 10)
	if err != nil || len(parked) != 2 {
		t.Fatalf("parked %+v, %v", parked, err)
	}
	if parked[0].Message.ID != "a2" || parked[0].Reason != "message too large" || string(parked[0].Message.Value) != "a2" ||
		parked[1].Message.ID != "c1" || !strings.Contains(parked[1].Reason, `no sink named "nowhere"`) {
		t.Fatalf("parked %+v", parked)
	}
	for _, m := range sink.messages() {
		if m.ID == "a3" {
			t.Fatal("a3 was published past its key's parked a2")
		}
	}
	if got := firstOrder(sink.messages())["b"]; strings.Join(got, ",") != "b1,b2" {
		t.Fatalf("key b after transient failures: %v", got)
	}
	sink.mu.Lock()
	delete(sink.refuse, "a2")
	sink.mu.Unlock()
	if n, err := o.Redrive(context.Background(), db, parked[0].Row); n != 1 || err != nil {
		t.Fatalf("redrive: %d, %v", n, err)
	}
	got := sink.waitFor(t, 2*time.Minute, "a2, a3", hasIDs("a2", "a3"))
	if o := firstOrder(got)["a"]; strings.Join(o, ",") != "a1,a2,a3" {
		t.Fatalf("key a: %v", o)
	}
	if n, err := o.Purge(context.Background(), db, parked[1].Row); n != 1 || err != nil {
		t.Fatalf("purge: %d, %v", n, err)
	}
}

// TestCleanup: published rows older than the retention go, in bounded
// batches; unpublished and parked rows stay.
func TestCleanup(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	sink := newMemSink()
	sink.refuse["p"] = Permanent(errors.New("no"))
	var msgs []Message
	for i := range 25 {
		msgs = append(msgs, msg(fmt.Sprint(i), fmt.Sprint("m", i)))
	}
	emit(t, db, o, append(msgs, msg("x", "p"))...)
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, Retention: time.Millisecond,
		CleanupInterval: 50 * time.Millisecond, CleanupBatch: 10})
	sink.waitFor(t, 2*time.Minute, "25 messages", func(m []Message) bool { return len(m) >= 25 })
	waitRows(t, db, 2*time.Minute, 1, `SELECT count(*) FROM effectively.outbox`)
	waitRows(t, db, time.Second, 1, `SELECT count(*) FROM effectively.outbox WHERE parked_at IS NOT NULL`)
}

// countingSink counts the messages a relay hands to a shared sink.
type countingSink struct {
	Sink
	n atomic.Int64
}

func (c *countingSink) Publish(ctx context.Context, msgs []Message) error {
	c.n.Add(int64(len(msgs)))
	return c.Sink.Publish(ctx, msgs)
}

// TestRelayParksLogModeRows: the table-polling relay cannot order the
// keyed messages of a LogMode outbox (no counter numbered them), so it
// moves them from the log table and parks them with the reason instead of
// publishing them out of order; messages without a key, which have no
// order, go out.
func TestRelayParksLogModeRows(t *testing.T) {
	db, o := setup(t, Config{})
	emit(t, db, o, msg("a", "a1"), Message{Sink: "s", Value: []byte("loose"), ID: "loose"})
	sink := newMemSink()
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}})
	sink.waitFor(t, time.Minute, "loose", hasIDs("loose"))
	waitRows(t, db, time.Minute, 1, `SELECT count(*) FROM effectively.outbox WHERE parked_at IS NOT NULL`)
	parked, err := o.Parked(context.Background(), db, 10)
	if err != nil || len(parked) != 1 || parked[0].Message.ID != "a1" || !strings.Contains(parked[0].Reason, "TableMode") {
		t.Fatalf("parked %+v, %v; want a1, with a reason naming TableMode", parked, err)
	}
	if hasIDs("a1")(sink.messages()) {
		t.Fatal("a1 was published")
	}
	waitRows(t, db, time.Minute, 0, `SELECT count(*) FROM effectively.outbox_log`)
}
