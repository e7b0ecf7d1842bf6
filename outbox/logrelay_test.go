package outbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

// startLogRelay runs a LogRelay until the test ends.
func startLogRelay(t *testing.T, db *pgxpool.Pool, cfg LogRelayConfig) (*LogRelay, *running) {
	t.Helper()
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	}
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = 100 * time.Millisecond
	}
	if cfg.StandbyRetry == 0 {
		cfg.StandbyRetry = 50 * time.Millisecond
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 100 * time.Millisecond
	}
	if cfg.CleanupInterval == 0 {
		cfg.CleanupInterval = time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = consumertest.Logger()
	}
	r, err := NewLogRelay(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{cancel: cancel, done: make(chan struct{})}
	go func() { run.err = r.Run(ctx); close(run.done) }()
	t.Cleanup(func() { cancel(); <-run.done })
	return r, run
}

// waitActive waits until r reads its slot: what is emitted from then on
// comes through the stream, not from the table.
func waitActive(t *testing.T, r *LogRelay) {
	t.Helper()
	waitUntil(t, time.Minute, "the relay reading its slot", func() bool { return r.Stats().Active })
}

// TestLogRelayCommitOrder: the log relay publishes in commit order, not in
// id order: a transaction that drew its ids first and commits last is
// published last; every message goes out with its ID and per key in
// commit order, from concurrent emitters of a LogMode outbox (no
// counter). The emitters learn their commit order per key from a witness
// row each updates after its emit and holds until it commits.
func TestLogRelayCommitOrder(t *testing.T) {
	db, o := setup(t, Config{})
	ctx := context.Background()
	if _, err := db.Exec(ctx, `CREATE TABLE witness (key text PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE witness_log (key text, msg_id text, n bigint)`); err != nil {
		t.Fatal(err)
	}
	sink := newMemSink()
	r, _ := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}, BatchSize: 7})
	// Creating the slot waits for the transactions open then: let it be.
	waitActive(t, r)

	// early draws its id first and commits after late.
	early, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Emit(ctx, early, msg("x", "early")); err != nil {
		t.Fatal(err)
	}
	emit(t, db, o, msg("y", "late"))
	sink.waitFor(t, time.Minute, "late", hasIDs("late"))
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	sink.waitFor(t, time.Minute, "early", hasIDs("early"))

	const workers, perWorker, keys = 6, 40, 5
	var wg sync.WaitGroup
	var want []string
	for w := range workers {
		for i := range perWorker {
			want = append(want, fmt.Sprintf("w%d-%d", w, i))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				id := fmt.Sprintf("w%d-%d", w, i)
				key := fmt.Sprint("k", (w+i)%keys)
				if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
					if err := o.Emit(ctx, tx, msg(key, id)); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `WITH w AS (
    INSERT INTO witness VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET n = witness.n + 1 RETURNING n)
INSERT INTO witness_log SELECT $1, $2, n FROM w`, key, id)
					return err
				}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	got := sink.waitFor(t, 2*time.Minute, "every message", hasIDs(want...))
	if got[0].ID != "late" || got[1].ID != "early" {
		t.Fatalf("published %v first; want late, early (commit order)", ids(got[:2]))
	}
	checkOrder(t, db, got[2:], `SELECT key, msg_id FROM witness_log ORDER BY key, n`)
}

// checkSeqOrder checks that, per key, the first deliveries in got follow
// the rows' seq and then their id: commit order for a TableMode outbox
// (its counters) and for emitters that commit one after the other.
func checkSeqOrder(t *testing.T, db *pgxpool.Pool, got []Message) {
	t.Helper()
	checkOrder(t, db, got, `SELECT key, msg_id FROM effectively.outbox WHERE key IS NOT NULL ORDER BY key, seq, id`)
}

// checkOrder checks that, per key, the first deliveries in got follow the
// order query returns (key, msg_id) in.
func checkOrder(t *testing.T, db *pgxpool.Pool, got []Message, query string) {
	t.Helper()
	rows, err := db.Query(context.Background(), query)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{}
	for rows.Next() {
		var k []byte
		var id string
		if err := rows.Scan(&k, &id); err != nil {
			t.Fatal(err)
		}
		want[string(k)] = append(want[string(k)], id)
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	first := firstOrder(got)
	for k, w := range want {
		if g := strings.Join(first[k], ","); g != strings.Join(w, ",") {
			t.Fatalf("key %s: first deliveries\n%s\nwant commit order\n%s", k, g, strings.Join(w, ","))
		}
	}
}

// TestLogRelaySlotDropped: the slot is dropped while messages wait (a DBA
// dropped it, or a failover lost it): the relay finds it gone, creates it
// again and publishes from the table everything not confirmed, with the
// same IDs. Nothing is lost.
func TestLogRelaySlotDropped(t *testing.T) {
	db, o := setup(t, Config{})
	ctx := context.Background()
	sink := newMemSink()
	r, _ := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}})
	waitActive(t, r)
	emit(t, db, o, msg("a", "a1"), msg("b", "b1"))
	sink.waitFor(t, time.Minute, "a1, b1", hasIDs("a1", "b1"))

	// Keep the relay out: end its stream and hold its lock, then drop the slot.
	lc, err := db.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Release()
	for got := false; !got; {
		if _, err := db.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, r.cfg.Slot); err != nil {
			t.Fatal(err)
		}
		if err := lc.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, r.lock).Scan(&got); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, time.Minute, "the slot dropped", func() bool {
		_, err := db.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, r.cfg.Slot)
		return err == nil
	})
	emit(t, db, o, msg("a", "a2"), msg("c", "c1"))
	emit(t, db, o, msg("a", "a3"))
	if _, err := lc.Exec(ctx, `SELECT pg_advisory_unlock($1)`, r.lock); err != nil {
		t.Fatal(err)
	}
	sink.waitFor(t, time.Minute, "a2, a3, c1", hasIDs("a2", "a3", "c1"))
	emit(t, db, o, msg("a", "a4")) // through the new slot
	got := sink.waitFor(t, time.Minute, "a4", hasIDs("a4"))
	if st := r.Stats(); st.SlotsLost != 1 || st.SlotsCreated != 2 || st.Recovered < 3 {
		t.Fatalf("stats %+v: want a slot lost, two created, at least the 3 waiting messages recovered", st)
	}
	known := map[string]bool{"a1": true, "a2": true, "a3": true, "a4": true, "b1": true, "c1": true}
	for _, m := range got {
		if !known[m.ID] || string(m.Value) != m.ID {
			t.Fatalf("published %q (%q): not a message emitted", m.ID, m.Value)
		}
	}
	if g := strings.Join(firstOrder(got)["a"], ","); g != "a1,a2,a3,a4" {
		t.Fatalf("key a: %s", g)
	}
}

// TestLogRelayCrashAndStandby: a relay crashes after publishing a batch
// and before confirming it; a standby takes the slot over and publishes
// that batch again (same IDs) and the rest. Nothing lost, first
// deliveries per key in commit order.
func TestLogRelayCrashAndStandby(t *testing.T) {
	db, o := setup(t, Config{})
	sink := newMemSink()
	var once sync.Once
	crashed := make(chan struct{})
	first, run1 := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}, BatchSize: 3, Owner: "first",
		afterPublish: func([]row) error {
			err := errCrash
			once.Do(func() { close(crashed) })
			return err
		}})
	waitActive(t, first)
	second, run2 := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}, BatchSize: 3, Owner: "second"})
	var all []Message
	for i := range 20 {
		all = append(all, msg(fmt.Sprint("k", i%3), fmt.Sprintf("m%02d", i)))
	}
	emit(t, db, o, all...)
	<-crashed
	<-run1.done
	if !errors.Is(run1.err, errCrash) {
		t.Fatalf("first relay: %v", run1.err)
	}
	got := sink.waitFor(t, time.Minute, "every message", hasIDs(ids(all)...))
	if !second.Stats().Active {
		t.Fatal("the standby did not take over")
	}
	checkSeqOrder(t, db, got)
	if n := len(got); n <= len(all) {
		t.Fatalf("got %d deliveries; the crashed relay's unconfirmed batch should be published again", n)
	}
	if err := run2.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestLogRelayParkAndRedrive: a message refused for good is parked, its
// key's later messages park behind it while other keys go on; a redrive
// publishes them, in order, and the key's next messages after them.
func TestLogRelayParkAndRedrive(t *testing.T) {
	db, o := setup(t, Config{})
	ctx := context.Background()
	sink := newMemSink()
	sink.refuse["a2"] = Permanent(errors.New("too large"))
	sink.failTimes["b1"] = 2
	r, _ := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}})
	waitActive(t, r)
	emit(t, db, o, msg("a", "a1"), msg("a", "a2"), msg("b", "b1"))
	emit(t, db, o, msg("a", "a3"), msg("c", "c1"))
	sink.waitFor(t, time.Minute, "a1, b1, c1", hasIDs("a1", "b1", "c1"))
	waitRows(t, db, time.Minute, 2, `SELECT count(*) FROM effectively.outbox WHERE parked_at IS NOT NULL`)
	parked, err := o.Parked(ctx, db, 10)
	if err != nil || len(parked) != 2 || parked[0].Message.ID != "a2" || parked[1].Message.ID != "a3" ||
		!strings.Contains(parked[1].Reason, "behind") {
		t.Fatalf("parked %+v %v", parked, err)
	}
	sink.mu.Lock()
	delete(sink.refuse, "a2")
	sink.mu.Unlock()
	if _, err := o.Redrive(ctx, db, parked[0].Row, parked[1].Row); err != nil {
		t.Fatal(err)
	}
	sink.waitFor(t, time.Minute, "a2, a3", hasIDs("a2", "a3"))
	emit(t, db, o, msg("a", "a4"))
	got := sink.waitFor(t, time.Minute, "a4", hasIDs("a4"))
	if g := strings.Join(firstOrder(got)["a"], ","); g != "a1,a2,a3,a4" {
		t.Fatalf("key a: %s", g)
	}
}

// TestLogRelayCleanup: the cleanup empties a half of the log table once
// the slot confirmed it, turn by turn, deletes the messages table's rows
// (TableMode) the slot confirmed, in id ranges, and keeps the parked ones,
// a parked LogMode message among them; nothing is lost across the turns.
func TestLogRelayCleanup(t *testing.T) {
	db, o := setup(t, Config{})
	tm, err := New(Config{Mode: TableMode})
	if err != nil {
		t.Fatal(err)
	}
	sink := newMemSink()
	sink.refuse["p"] = Permanent(errors.New("no"))
	r, _ := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}, CleanupInterval: 50 * time.Millisecond, CleanupBatch: 3})
	waitActive(t, r)
	var all []Message
	for round := range 3 {
		var logMsgs, tableMsgs []Message
		for i := range 10 {
			logMsgs = append(logMsgs, msg(fmt.Sprint("k", i%4), fmt.Sprint("m", round, "-", i)))
			tableMsgs = append(tableMsgs, msg(fmt.Sprint("t", i%4), fmt.Sprint("t", round, "-", i)))
		}
		if round == 0 {
			logMsgs = append(logMsgs, msg("z", "p"))
		}
		emit(t, db, o, logMsgs...)
		emit(t, db, tm, tableMsgs...)
		all = append(append(all, logMsgs...), tableMsgs...)
		want := ids(all)
		want = slices.DeleteFunc(want, func(id string) bool { return id == "p" })
		sink.waitFor(t, time.Minute, "every message", hasIDs(want...))
		// Both halves are emptied in turn: the one emitted to, after the
		// switch, and the other before the next.
		waitRows(t, db, time.Minute, 0, `SELECT count(*) FROM effectively.outbox_log`)
		waitUntil(t, time.Minute, "a truncation per round", func() bool { return r.Stats().Truncated >= round+1 })
	}
	waitRows(t, db, time.Minute, 1, `SELECT count(*) FROM effectively.outbox`)
	waitRows(t, db, time.Minute, 1, `SELECT count(*) FROM effectively.outbox WHERE msg_id = 'p' AND parked_at IS NOT NULL AND key = 'z'`)
	if st := r.Stats(); st.Deleted != 30 || st.Published != 60 || st.Parked != 1 {
		t.Fatalf("stats %+v", st)
	}
	if got := len(sink.messages()); got != 60 {
		t.Fatalf("the sink got %d messages, want each of the 60 once", got)
	}
}

// TestLogRelayKafka: through kfake, with a Kafka sink, a foreign reader
// finds every message with its ID as the idempotency-key header, per key
// in commit order, across a relay restart.
func TestLogRelayKafka(t *testing.T) {
	db, o := setup(t, Config{})
	k := kafkatest.New(t)
	ctx := context.Background()
	topic := kafkatest.Name("logrelay")
	if err := k.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	sinks := map[string]Sink{"s": kafkaSink(t, k, topic, 0)}
	r, run := startLogRelay(t, db, LogRelayConfig{Sinks: sinks})
	waitActive(t, r)
	var all []Message
	for i := range 300 {
		all = append(all, msg(fmt.Sprint("k", i%7), fmt.Sprintf("m%03d", i)))
	}
	for lo := 0; lo < 150; lo += 10 {
		emit(t, db, o, all[lo:lo+10]...)
	}
	waitUntil(t, time.Minute, "the first half published", func() bool { return r.Stats().Published >= 100 })
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	for lo := 150; lo < 300; lo += 10 {
		emit(t, db, o, all[lo:lo+10]...)
	}
	startLogRelay(t, db, LogRelayConfig{Sinks: sinks})

	rd := kafkago.NewReader(kafkago.ReaderConfig{Brokers: k.Brokers(), Topic: topic, Partition: 0, MaxWait: kafkatest.MaxWait})
	defer rd.Close()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var got []Message
	seen := map[string]bool{}
	for len(seen) < len(all) {
		m, err := rd.ReadMessage(rctx)
		if err != nil {
			t.Fatalf("after %d messages: %v", len(got), err)
		}
		var id string
		for _, h := range m.Headers {
			if h.Key == IDHeader {
				id = string(h.Value)
			}
		}
		if id == "" || string(m.Value) != id {
			t.Fatalf("message %q with ID %q", m.Value, id)
		}
		seen[id] = true
		got = append(got, Message{Key: m.Key, ID: id})
	}
	checkSeqOrder(t, db, got)
}

// TestLogRelayCrashDuringRecovery: a relay that created its slot crashes
// while publishing what the table held before it. The slot exists, but
// cannot deliver those messages: the next relay finds the slot not ready
// and publishes them from the table before reading it.
func TestLogRelayCrashDuringRecovery(t *testing.T) {
	db, o := setup(t, Config{})
	sink := newMemSink()
	var all []Message
	for i := range 12 {
		all = append(all, msg(fmt.Sprint("k", i%3), fmt.Sprintf("m%02d", i)))
	}
	emit(t, db, o, all...)
	_, run1 := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}, BatchSize: 4,
		afterPublish: func([]row) error { return errCrash }})
	<-run1.done
	if !errors.Is(run1.err, errCrash) {
		t.Fatalf("first relay: %v", run1.err)
	}
	r, _ := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}, BatchSize: 4})
	waitActive(t, r)
	got := sink.waitFor(t, time.Minute, "every message", hasIDs(ids(all)...))
	checkSeqOrder(t, db, got)
	if st := r.Stats(); st.Recovered != int64(len(all)) || st.SlotsCreated != 0 {
		t.Fatalf("stats %+v: want the %d messages recovered from the table, and the slot kept", st, len(all))
	}
}

// TestLogRelaySlotInvalidated: on a server with max_slot_wal_keep_size,
// the slot of a stopped relay falls behind and is invalidated while
// messages wait in it. The next relay drops it, creates it again and
// publishes the waiting messages from the table: nothing lost.
func TestLogRelaySlotInvalidated(t *testing.T) {
	if os.Getenv("TEST_DATABASE_URL") != "" {
		t.Skip("needs a server of its own, with max_slot_wal_keep_size")
	}
	ctx := context.Background()
	c, err := pgtest.Start(ctx, pgtest.Options{Settings: []string{"max_slot_wal_keep_size=1MB"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	db, o := migratedOutbox(t, c.URL())
	sink := newMemSink()
	r, run := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}})
	waitActive(t, r)
	emit(t, db, o, msg("a", "a1"))
	sink.waitFor(t, time.Minute, "a1", hasIDs("a1"))
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	emit(t, db, o, msg("a", "a2"), msg("b", "b1"))
	emit(t, db, o, msg("a", "a3"))
	if _, err := db.Exec(ctx, `CREATE TABLE filler (x text)`); err != nil {
		t.Fatal(err)
	}
	for status := ""; status != "lost"; {
		if _, err := db.Exec(ctx, `INSERT INTO filler SELECT md5(i::text) FROM generate_series(1, 100000) AS i`); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(ctx, `SELECT pg_switch_wal()`); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(ctx, `CHECKPOINT`); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(ctx, `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, r.cfg.Slot).Scan(&status); err != nil {
			t.Fatal(err)
		}
	}
	r2, _ := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}})
	got := sink.waitFor(t, time.Minute, "a2, a3, b1", hasIDs("a2", "a3", "b1"))
	if g := strings.Join(firstOrder(got)["a"], ","); g != "a1,a2,a3" {
		t.Fatalf("key a: %s", g)
	}
	if st := r2.Stats(); st.SlotsLost != 1 || st.SlotsCreated != 1 {
		t.Fatalf("stats %+v: want the invalidated slot replaced", st)
	}
}

// TestLogRelayFailover: the primary dies while messages wait in the slot,
// and the standby is promoted. PostgreSQL 15 does not carry logical slots
// to a standby: the relay, reconnecting through the multi-host URL, finds
// its slot gone on the new primary, creates it and publishes the waiting
// messages from the replicated table. Nothing lost.
func TestLogRelayFailover(t *testing.T) {
	if os.Getenv("TEST_DATABASE_URL") != "" {
		t.Skip("needs a replicated pair of its own")
	}
	ctx := context.Background()
	rep, err := pgtest.StartReplicated(ctx, pgtest.ReplicaOptions{Synchronous: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rep.Stop() })
	url, err := rep.CreateDatabase(ctx, "logrelay")
	if err != nil {
		t.Fatal(err)
	}
	db, o := migratedOutbox(t, url)
	sink := newMemSink()
	r, run := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}})
	waitActive(t, r)
	emit(t, db, o, msg("a", "a1"))
	sink.waitFor(t, time.Minute, "a1", hasIDs("a1"))
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	emit(t, db, o, msg("a", "a2"), msg("b", "b1")) // synchronous: on the standby too
	emit(t, db, o, msg("a", "a3"))
	if err := rep.KillPrimary(); err != nil {
		t.Fatal(err)
	}
	if err := rep.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	got := sink.waitFor(t, 2*time.Minute, "a2, a3, b1", hasIDs("a2", "a3", "b1"))
	if g := strings.Join(firstOrder(got)["a"], ","); g != "a1,a2,a3" {
		t.Fatalf("key a: %s", g)
	}
	if st := r.Stats(); st.SlotsLost != 1 {
		t.Fatalf("stats %+v: want the slot found lost after the failover", st)
	}
}

// TestLogRelayNeedsReplication: a role without the REPLICATION attribute
// gets a clear error from Run, which stops instead of retrying forever.
func TestLogRelayNeedsReplication(t *testing.T) {
	db, _ := setup(t, Config{})
	ctx := context.Background()
	role := fmt.Sprintf("norepl_%d", time.Now().UnixNano())
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN`,
		`GRANT USAGE ON SCHEMA effectively TO ` + role,
		`GRANT SELECT, UPDATE, DELETE ON ALL TABLES IN SCHEMA effectively TO ` + role,
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	cfg := db.Config().Copy()
	cfg.ConnConfig.User = role
	limited, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		limited.Close()
		_, _ = db.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = db.Exec(context.Background(), `DROP ROLE `+role)
	})
	r, err := NewLogRelay(limited, LogRelayConfig{Sinks: map[string]Sink{"s": newMemSink()}, Logger: consumertest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	// The owner creates the publication; the relay's role may not.
	if _, err := db.Exec(ctx, `CREATE PUBLICATION `+r.cfg.Publication+` FOR TABLE effectively.outbox, effectively.outbox_log WITH (publish = 'insert')`); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = r.Run(rctx)
	t.Logf("Run: %v", err)
	if err == nil || !strings.Contains(err.Error(), "replication") {
		t.Fatalf("Run: %v; want an error saying replication is not allowed", err)
	}
}

// migratedOutbox returns a pool on the database at url, closed at the end
// of the test, and an outbox with its tables migrated there.
func migratedOutbox(t *testing.T, url string) (*pgxpool.Pool, *Outbox) {
	t.Helper()
	ctx := context.Background()
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	o, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Migrate(ctx, db, "", o.Line()); err != nil {
		t.Fatal(err)
	}
	return db, o
}

// TestLogRelayAfterModeSwitch: an outbox read by the table-polling Relay
// (TableMode) moves to a LogRelay, its emitters to LogMode, while messages
// wait. Emitters switched first: a key's newer LogMode rows (seq 0) wait
// beside its older TableMode rows (seq from 1), and the log relay's first
// read of the table publishes the older ones first.
func TestLogRelayAfterModeSwitch(t *testing.T) {
	db, table := setup(t, Config{Mode: TableMode})
	logMode, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	emit(t, db, table, msg("a", "a1"), msg("a", "a2"), msg("b", "b1"))
	emit(t, db, table, msg("a", "a3"))
	emit(t, db, logMode, msg("a", "a4"), msg("b", "b2"))
	emit(t, db, logMode, msg("a", "a5"))
	sink := newMemSink()
	startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}})
	got := sink.waitFor(t, time.Minute, "every message", hasIDs("a1", "a2", "a3", "a4", "a5", "b1", "b2"))
	order := firstOrder(got)
	if g := strings.Join(order["a"], ","); g != "a1,a2,a3,a4,a5" {
		t.Fatalf("key a published %s, want a1,a2,a3,a4,a5", g)
	}
	if g := strings.Join(order["b"], ","); g != "b1,b2" {
		t.Fatalf("key b published %s, want b1,b2", g)
	}
}

// TestLogRelayAddsTheLogTable: a publication made before the log table
// existed (of the messages table alone) gets the log table added, so a
// LogMode emit is published, not left unread in the log table.
func TestLogRelayAddsTheLogTable(t *testing.T) {
	db, o := setup(t, Config{})
	ctx := context.Background()
	sink := newMemSink()
	cfg := LogRelayConfig{Sinks: map[string]Sink{"s": sink}}
	if err := cfg.defaults(db.Config().ConnConfig.Database); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `CREATE PUBLICATION `+cfg.Publication+` FOR TABLE effectively.outbox WITH (publish = 'insert')`); err != nil {
		t.Fatal(err)
	}
	r, _ := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}})
	waitActive(t, r)
	emit(t, db, o, msg("a", "a1"), msg("a", "a2"))
	sink.waitFor(t, time.Minute, "a1, a2", hasIDs("a1", "a2"))
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM pg_publication_tables WHERE pubname = $1`, cfg.Publication).Scan(&n); err != nil || n < 2 {
		t.Fatalf("the publication lists %d tables (%v), want the outbox and the log table", n, err)
	}
}

// TestLogRelayCleanupLeftHalfWithoutTruncate: a half of the log table left
// with rows by a relay that switched halves and stopped is emptied before
// the next switch, and a relay whose role may not TRUNCATE the halves
// empties them with DELETE. Nothing is lost: every message is published,
// each key in order.
func TestLogRelayCleanupLeftHalfWithoutTruncate(t *testing.T) {
	db, o := setup(t, Config{})
	ctx := context.Background()
	// An earlier relay switched emits to half 1 and stopped before it
	// truncated half 0.
	emit(t, db, o, msg("a", "a1"), msg("b", "b1"))
	if _, err := db.Exec(ctx, `UPDATE effectively.outbox_log_half SET half = 1`); err != nil {
		t.Fatal(err)
	}
	emit(t, db, o, msg("a", "a2"))

	role := fmt.Sprintf("relay_%d", time.Now().UnixNano())
	for _, q := range []string{
		`CREATE ROLE ` + role + ` LOGIN REPLICATION`,
		`GRANT USAGE ON SCHEMA effectively TO ` + role,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA effectively TO ` + role,
		`GRANT USAGE ON ALL SEQUENCES IN SCHEMA effectively TO ` + role,
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	cfg := db.Config().Copy()
	cfg.ConnConfig.User = role
	limited, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the relay stops, then its pool closes.
	t.Cleanup(func() {
		limited.Close()
		_, _ = db.Exec(context.Background(), `DROP OWNED BY `+role)
		_, _ = db.Exec(context.Background(), `DROP ROLE `+role)
	})
	sink := newMemSink()
	r, _ := startLogRelay(t, limited, LogRelayConfig{Sinks: map[string]Sink{"s": sink}, CleanupInterval: 50 * time.Millisecond})
	// The owner creates the publication; the relay's role may not.
	if _, err := db.Exec(ctx, `CREATE PUBLICATION `+r.cfg.Publication+` FOR TABLE effectively.outbox, effectively.outbox_log WITH (publish = 'insert')`); err != nil {
		t.Fatal(err)
	}
	waitActive(t, r)
	emit(t, db, o, msg("a", "a3"))
	got := sink.waitFor(t, time.Minute, "a1, a2, a3, b1", hasIDs("a1", "a2", "a3", "b1"))
	if g := strings.Join(firstOrder(got)["a"], ","); g != "a1,a2,a3" {
		t.Fatalf("key a: %s", g)
	}
	waitRows(t, db, time.Minute, 0, `SELECT count(*) FROM effectively.outbox_log`)
	waitUntil(t, time.Minute, "both halves emptied", func() bool { return r.Stats().Truncated >= 2 })
	var canTruncate bool
	if err := db.QueryRow(ctx, `SELECT has_table_privilege($1, 'effectively.outbox_log_0', 'TRUNCATE')`, role).Scan(&canTruncate); err != nil || canTruncate {
		t.Fatalf("the relay's role may truncate (%v); the test needs one that may not", err)
	}
}
