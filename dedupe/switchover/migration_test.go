package switchover_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/dedupe/switchover"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

// clock is a Config.Now the test moves.
type clock struct{ ns atomic.Int64 }

func newClock(t time.Time) *clock { c := &clock{}; c.ns.Store(t.UnixNano()); return c }
func (c *clock) now() time.Time   { return time.Unix(0, c.ns.Load()) }
func (c *clock) set(t time.Time)  { c.ns.Store(t.UnixNano()) }
func count(t *testing.T, pool *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The keys the old strategy recorded are duplicates through the Migration,
// where the new strategy alone calls them new; keys it never saw are
// decided by the new strategy; the old store gets no marker; after Until
// the old store is no longer read.
func TestMigrationConsultsTheOldStore(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	old, nw := newIDSet(t), newBloom(t)
	prepare(t, pool, old)
	prepare(t, pool, nw)

	k := func(i int) dedupe.Key { return key("orders", "s", i) }
	fp := func(i int, payload string) dedupe.Key {
		x := k(i)
		x.Fingerprint = dedupe.Fingerprint([]byte(payload))
		return x
	}
	// Before the switch: the old strategy records 1, 2, 3 (3 with a payload).
	claim(t, pool, old, k(1), k(2), fp(3, "A"))

	// The window of doubles the Migration closes: the new strategy alone
	// would apply every one of them again. (In a transaction rolled back,
	// so that the new store stays empty.)
	func() {
		ctx := context.Background()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		vs, err := nw.Claim(ctx, tx, []dedupe.Key{k(1), k(2), k(3)})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := verdicts(vs...), verdicts(vNew, vNew, vNew); got != want {
			t.Fatalf("the new strategy alone: %s, want %s", got, want)
		}
	}()

	start := time.Now()
	clk := newClock(start)
	m, err := switchover.New(switchover.Config{Old: old, New: nw, Since: start, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	if st := m.Status(); !st.Consulting || st.Droppable() || !st.Until.Equal(start.Add(time.Hour)) || st.Remaining != time.Hour {
		t.Fatalf("Status at the start: %+v, want consulting for the old retention of an hour", st)
	}
	s := m.Strategy()
	for _, tc := range []struct {
		what string
		keys []dedupe.Key
		want []dedupe.Verdict
	}{
		{"known to the old store, or new", []dedupe.Key{k(1), k(4), k(2)}, []dedupe.Verdict{vDup, vNew, vDup}},
		{"new in the new store now", []dedupe.Key{k(4)}, []dedupe.Verdict{vDup}},
		{"the old marker's fingerprint", []dedupe.Key{fp(3, "A"), fp(3, "B"), k(3)}, []dedupe.Verdict{vDup, vMis, vDup}},
		{"repeats of a known and an unknown key", []dedupe.Key{k(2), k(2), k(5), k(5)}, []dedupe.Verdict{vDup, vDup, vNew, vDup}},
	} {
		if got, want := verdicts(claim(t, pool, s, tc.keys...)...), verdicts(tc.want...); got != want {
			t.Errorf("%s: Claim = %s, want %s", tc.what, got, want)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM effectively.old_processed`); n != 3 {
		t.Errorf("the old store holds %d markers, want its 3: the Migration must not write to it", n)
	}
	if st := m.Stats(); st.Keys != 11 || st.Lookups != 11 || st.KnownToOld != 7 {
		t.Errorf("Stats = %+v, want 11 keys, 11 looked up, 7 known to the old store", st)
	}

	// A rolled-back claim leaves nothing in either store.
	func() {
		ctx := context.Background()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		vs, err := s.Claim(ctx, tx, []dedupe.Key{k(6), k(1)})
		if err != nil || verdicts(vs...) != verdicts(vNew, vDup) {
			t.Fatalf("Claim = %v, %v", vs, err)
		}
		_ = tx.Rollback(ctx)
	}()
	if got := verdicts(claim(t, pool, s, k(6))...); got != verdicts(vNew) {
		t.Errorf("after a rolled-back claim: %s, want [new]", got)
	}

	// Past Until, the old store is no longer read: what only it knew is
	// new again, by then past the source's redelivery horizon.
	clk.set(start.Add(time.Hour))
	if st := m.Status(); st.Consulting || !st.Droppable() || st.Remaining != 0 {
		t.Errorf("Status past Until: %+v, want the old store droppable", st)
	}
	if got := verdicts(claim(t, pool, s, k(1), k(4))...); got != verdicts(vNew, vDup) {
		t.Errorf("past Until: %s, want [new duplicate]", got)
	}
	if st := m.Stats(); st.Lookups != 14 {
		t.Errorf("past Until the old store was consulted: %d lookups, want 14", st.Lookups)
	}

	// MarkerStats shows both stores and the switch.
	ms, err := s.(dedupe.Inspector).MarkerStats(context.Background(), pool, "")
	if err != nil {
		t.Fatal(err)
	}
	if ms.Strategy != "idset->bloom" || len(ms.Tables) != 2 || ms.Details["switchover_old_markers"] != "3" ||
		ms.Details["switchover_consulting"] != "false" || ms.Details["switchover_old_newest"] == "" {
		t.Errorf("MarkerStats = %+v", ms)
	}
}

// Switching from idset to highwater (monotonic), the keys the old store
// knows are not claimed by the new one, so they do not move its marks: a
// message the old strategy never applied, below one it applied, is still
// new.
func TestMigrationToHighwaterKeepsHoles(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	old, nw := newIDSet(t), newHighwater(t)
	prepare(t, pool, old)
	prepare(t, pool, nw)
	var before []dedupe.Key
	for i := 1; i <= 60; i++ {
		if i != 51 { // 51 failed and waits for its redelivery
			before = append(before, key("ledger", "acct-1", i))
		}
	}
	claim(t, pool, old, before...)

	m, err := switchover.New(switchover.Config{Old: old, New: nw, Until: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	s := m.Strategy()
	if sq, ok := s.(dedupe.Sequencer); !ok || !sq.Sequenced() {
		t.Error("the Migration to a monotonic highwater is not Sequenced")
	}
	if kc, ok := s.(dedupe.KeyChecker); !ok {
		t.Error("the Migration to highwater is not a KeyChecker")
	} else if err := kc.CheckKey(dedupe.Key{Scope: "ledger", ID: "x"}); !errors.Is(err, dedupe.ErrInvalidKey) {
		t.Errorf("CheckKey of a key without a sender: %v, want a KeyError", err)
	}
	if _, ok := s.(dedupe.Retainer); ok {
		t.Error("the Migration to highwater is a Retainer; highwater's marks do not expire")
	}
	k := func(i int) dedupe.Key { return key("ledger", "acct-1", i) }
	for _, tc := range []struct {
		what string
		keys []dedupe.Key
		want []dedupe.Verdict
	}{
		{"redelivered after the switch", []dedupe.Key{k(55), k(60)}, []dedupe.Verdict{vDup, vDup}},
		{"the hole", []dedupe.Key{k(51)}, []dedupe.Verdict{vNew}},
		{"new messages", []dedupe.Key{k(61), k(62)}, []dedupe.Verdict{vNew, vNew}},
		{"old ones again", []dedupe.Key{k(1), k(52), k(62)}, []dedupe.Verdict{vDup, vDup, vDup}},
	} {
		if got, want := verdicts(claim(t, pool, s, tc.keys...)...), verdicts(tc.want...); got != want {
			t.Errorf("%s: Claim = %s, want %s", tc.what, got, want)
		}
	}
	if st := nw.Stats(); st.Gaps != 0 {
		t.Errorf("highwater counted %d gaps", st.Gaps)
	}
}

func TestMigrationConfig(t *testing.T) {
	t.Parallel()
	idA, bl, hw := newIDSet(t), newBloom(t), newHighwater(t)
	other, err := highwater.New(highwater.Config{Table: "marks2"})
	if err != nil {
		t.Fatal(err)
	}
	sameTable := newIDSet(t)
	now := time.Now()
	for _, tc := range []struct {
		what  string
		cfg   switchover.Config
		field string
	}{
		{"no old strategy", switchover.Config{New: bl, Until: now}, "Old"},
		{"no new strategy", switchover.Config{Old: idA, Until: now}, "New"},
		{"the same strategy", switchover.Config{Old: idA, New: idA, Until: now}, "New"},
		{"the same tables", switchover.Config{Old: idA, New: sameTable, Until: now}, "New"},
		{"neither Until nor Since", switchover.Config{Old: idA, New: bl}, "Until"},
		{"Since alone, from markers that never expire", switchover.Config{Old: hw, New: other, Since: now}, "Until"},
		{"Until before Since", switchover.Config{Old: idA, New: bl, Since: now, Until: now.Add(-time.Second)}, "Until"},
	} {
		_, err := switchover.New(tc.cfg)
		var ce *pg.ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, pg.ErrInvalidConfig) || ce.Field != tc.field {
			t.Errorf("%s: New returned %v, want a ConfigError of field %s", tc.what, err, tc.field)
		}
	}
	if _, err := switchover.New(switchover.Config{Old: hw, New: bl, Until: now}); err != nil {
		t.Errorf("highwater to bloom with Until: %v", err)
	}
}

// With highwater as the old strategy, a key is known when its seq was at
// or below its sender's mark before the claim: a later seq earlier in the
// batch does not make it known (highwater alone, judging the batch in its
// order, would call 5 a duplicate after 6).
func TestMigrationFromHighwaterJudgesEachKeyByTheMarkBefore(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	old, nw := newHighwater(t), newIDSet(t)
	prepare(t, pool, old)
	prepare(t, pool, nw)
	k := func(i int) dedupe.Key { return key("ledger", "acct-1", i) }
	claim(t, pool, old, k(1), k(2), k(3), k(4))

	m, err := switchover.New(switchover.Config{Old: old, New: nw, Until: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := verdicts(claim(t, pool, m.Strategy(), k(6), k(5), k(4), k(6), k(2))...), verdicts(vNew, vNew, vDup, vDup, vDup); got != want {
		t.Errorf("Claim = %s, want %s", got, want)
	}
}
