package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/consumertest"
)

// TestReadAheadKeepsOrder: the relay reads its next batch while it
// publishes the current one, so that batch holds later rows of keys whose
// current rows may fail. Keys spread over many small batches, with
// transient failures and one refusal for good: each key's first deliveries
// are in commit order, and nothing of the refused key passes it.
func TestReadAheadKeepsOrder(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	sink := newMemSink()
	const keys, perKey = 4, 40
	var all []Message
	for i := range perKey {
		for k := range keys {
			id := fmt.Sprintf("k%d-%02d", k, i)
			all = append(all, msg(fmt.Sprint("k", k), id))
			if i%7 == 3 {
				sink.failTimes[id] = 1 + i%2
			}
		}
	}
	sink.refuse["k3-25"] = Permanent(errors.New("too large"))
	emit(t, db, o, all...)
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, BatchSize: 5})
	waitRows(t, db, 2*time.Minute, 1, `SELECT count(*) FROM effectively.outbox WHERE parked_at IS NOT NULL`)
	waitRows(t, db, 2*time.Minute, 0, `SELECT count(*) FROM effectively.outbox WHERE published_at IS NULL AND parked_at IS NULL AND key <> 'k3'`)
	got := firstOrder(sink.messages())
	for k := range keys {
		var want []string
		for i := range perKey {
			if k == 3 && i == 25 {
				break
			}
			want = append(want, fmt.Sprintf("k%d-%02d", k, i))
		}
		if g := strings.Join(got[fmt.Sprint("k", k)], ","); g != strings.Join(want, ",") {
			t.Fatalf("key k%d: first deliveries\n%s\nwant commit order\n%s", k, g, strings.Join(want, ","))
		}
	}
}

// TestDeleteOnPublish: with Retention DeleteOnPublish a published row is
// deleted as it is marked; one put off or parked stays until it is
// published, redriven or purged.
func TestDeleteOnPublish(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	sink := newMemSink()
	sink.failTimes["a2"] = 2
	sink.refuse["b1"] = Permanent(errors.New("too large"))
	emit(t, db, o, msg("a", "a1"), msg("a", "a2"), msg("a", "a3"), msg("b", "b1"), msg("b", "b2"), msg("c", "c1"))
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, Retention: DeleteOnPublish})
	sink.waitFor(t, 2*time.Minute, "a1, a2, a3, c1", hasIDs("a1", "a2", "a3", "c1"))
	waitRows(t, db, 2*time.Minute, 2, `SELECT count(*) FROM effectively.outbox`)
	parked, err := o.Parked(context.Background(), db, 10)
	if err != nil || len(parked) != 1 || parked[0].Message.ID != "b1" {
		t.Fatalf("parked %+v, %v", parked, err)
	}
	if got := firstOrder(sink.messages())["a"]; strings.Join(got, ",") != "a1,a2,a3" {
		t.Fatalf("key a: %v", got)
	}
	sink.mu.Lock()
	delete(sink.refuse, "b1")
	sink.mu.Unlock()
	if n, err := o.Redrive(context.Background(), db, parked[0].Row); n != 1 || err != nil {
		t.Fatalf("redrive: %d, %v", n, err)
	}
	sink.waitFor(t, 2*time.Minute, "b1, b2", hasIDs("b1", "b2"))
	waitRows(t, db, 2*time.Minute, 0, `SELECT count(*) FROM effectively.outbox`)
}

// TestHotPartitionFillsBatches: a backlog on one key, so in one of the 64
// partitions, still fills whole batches: a fetch starts at an even share
// per partition and widens it while partitions have more than it read.
func TestHotPartitionFillsBatches(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	var all []Message
	for i := range 600 {
		all = append(all, msg("hot", fmt.Sprint("h", i)))
	}
	emit(t, db, o, all...)
	reads := make(chan int, 1000)
	sink := newMemSink()
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, BatchSize: 100,
		Hooks: []RelayHook{passFunc(func(s *PassStats) { reads <- s.Read })}})
	sink.waitFor(t, 2*time.Minute, "600 messages", func(m []Message) bool { return len(m) >= 600 })
	full := 0
	for len(reads) > 0 {
		if <-reads == 100 {
			full++
		}
	}
	if full < 2 {
		t.Fatalf("%d passes of 100 rows for a backlog of 600 on one key", full)
	}
}

type passFunc func(*PassStats)

func (f passFunc) PassDone(_ context.Context, s *PassStats) { f(s) }

// TestFetchPlanFollowsTheBacklog: a relay that starts on an empty outbox
// and has fetched many times must not keep a plan made for the empty
// table: once a backlog builds, each fetch reads its partitions through
// the index, not the whole table once per partition. The reads are
// counted by the transaction's own table statistics.
func TestFetchPlanFollowsTheBacklog(t *testing.T) {
	pool, o := setup(t, Config{Mode: TableMode})
	ctx := context.Background()
	// An outbox emptied and vacuumed: the planner knows it has no rows.
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE effectively.outbox`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	r, err := NewRelay(tx, RelayConfig{Sinks: map[string]Sink{"s": newMemSink()}, Logger: consumertest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.tickLeases(ctx); err != nil {
		t.Fatal(err)
	}
	parts, _ := r.held()
	for range 10 { // past the five executions after which a cached plan may turn generic
		if _, _, err := r.fetch(ctx, parts, 500, nil); err != nil {
			t.Fatal(err)
		}
	}
	var backlog []Message
	for i := range 10000 {
		backlog = append(backlog, msg(fmt.Sprint("k", i%500), fmt.Sprint("m", i)))
	}
	if err := o.Emit(ctx, tx, backlog...); err != nil {
		t.Fatal(err)
	}
	seqRead := func() int64 {
		var n int64
		if err := tx.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) FROM pg_stat_xact_user_tables
WHERE schemaname = 'effectively' AND relname = 'outbox'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := seqRead()
	// With a plan made for the empty table this fetch takes minutes; the
	// deadline only bounds that failure.
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rows, _, err := r.fetch(fctx, parts, 500, nil)
	if err != nil || len(rows) != 500 {
		t.Fatalf("fetch: %d rows, %v", len(rows), err)
	}
	if read := seqRead() - before; read > 10000 {
		t.Fatalf("one fetch of 500 rows read %d rows by sequential scan", read)
	}
}

// TestPruneCounters: the cleanup deletes the counters of keys with nothing
// waiting, and keeps those of keys with a parked row or an emitter still
// open; a key emitted to again after its counter went starts again at 1,
// and one whose emitter was open goes on from its counter.
func TestPruneCounters(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	ctx := context.Background()
	sink := newMemSink()
	sink.refuse["b1"] = Permanent(errors.New("no"))
	emit(t, db, o, msg("a", "a1"), msg("b", "b1"), msg("d", "d0"))
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := o.Emit(ctx, tx, msg("d", "d1")); err != nil {
		t.Fatal(err)
	}
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, CleanupInterval: 20 * time.Millisecond})
	sink.waitFor(t, 2*time.Minute, "a1, d0", hasIDs("a1", "d0"))
	waitRows(t, db, 2*time.Minute, 0, `SELECT count(*) FROM effectively.outbox_counters WHERE key = 'a'`)
	var keys string
	if err := db.QueryRow(ctx, `SELECT string_agg(convert_from(key, 'UTF8'), ',' ORDER BY key) FROM effectively.outbox_counters`).Scan(&keys); err != nil {
		t.Fatal(err)
	}
	if keys != "b,d" {
		t.Fatalf("counters left: %s, want b (parked) and d (an emitter open)", keys)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	emit(t, db, o, msg("a", "a2"))
	sink.waitFor(t, 2*time.Minute, "d1, a2", hasIDs("d1", "a2"))
	rows, err := db.Query(ctx, `SELECT msg_id || '=' || seq FROM effectively.outbox WHERE msg_id IN ('a2', 'd1') ORDER BY msg_id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	rows.Close()
	if g := strings.Join(got, " "); g != "a2=1 d1=2" {
		t.Fatalf("seqs %s, want a2=1 (a new counter) d1=2", g)
	}
}
