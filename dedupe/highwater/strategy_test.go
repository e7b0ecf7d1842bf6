package highwater_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/pg"
)

func keys(sender string, seqs ...int64) []dedupe.Key {
	out := make([]dedupe.Key, len(seqs))
	for i, s := range seqs {
		out[i] = key(sender, s)
	}
	return out
}

// TestStrictBatches: consecutive seqs in a batch all apply; a seq after a
// hole in the batch is a gap even if the hole is filled later in the batch
// (its handler would otherwise run first); a batch gets the verdicts that
// delivering its keys one by one would give.
func TestStrictBatches(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t)
	s := newStrategy(t, pool, highwater.Config{})
	steps := []struct {
		keys []dedupe.Key
		want string
		mark int64
	}{
		{keys("x", 1, 2, 3), "new new new", 3},
		{keys("x", 5, 4, 5, 6, 3), "gap new new new duplicate", 6},
		{keys("x", 5, 7, 9, 8, 9), "duplicate new gap new new", 9},
		{keys("x", 9, 10, 12, 11), "duplicate new gap new", 11},
	}
	for i, st := range steps {
		if got := verdictNames(claimTx(t, pool, s, st.keys, nil)); got != st.want {
			t.Errorf("step %d: verdicts %q, want %q", i, got, st.want)
		}
		if got := marks(t, pool, "marks")["x"]; got != st.mark {
			t.Errorf("step %d: mark %d, want %d", i, got, st.mark)
		}
	}
	if st := s.Stats(); st.Gaps != 3 {
		t.Errorf("Stats.Gaps = %d, want 3", st.Gaps)
	}
	// Each step also held the same batch back one by one: compare.
	pool2, _ := newPool(t)
	s2 := newStrategy(t, pool2, highwater.Config{CacheSize: -1})
	for i, st := range steps {
		var got []dedupe.Verdict
		for _, k := range st.keys {
			got = append(got, claimTx(t, pool2, s2, []dedupe.Key{k}, nil)...)
		}
		if verdictNames(got) != st.want {
			t.Errorf("step %d one by one: %q, want %q", i, verdictNames(got), st.want)
		}
	}
}

// TestMonotonic: any seq above the mark is new and moves the mark, holes and
// all; seq <= mark is a duplicate; there are no gaps.
func TestMonotonic(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t)
	s := newStrategy(t, pool, highwater.Config{Mode: highwater.Monotonic, Table: "offsets"})
	steps := []struct {
		keys []dedupe.Key
		want string
	}{
		{keys("p0", 5, 3, 9, 9, 12), "new duplicate new duplicate new"},
		{keys("p0", 12, 11, 100), "duplicate duplicate new"},
		{append(keys("p1", 1000), keys("p0", 101, 100)...), "new new duplicate"},
	}
	for i, st := range steps {
		if got := verdictNames(claimTx(t, pool, s, st.keys, nil)); got != st.want {
			t.Errorf("step %d: verdicts %q, want %q", i, got, st.want)
		}
	}
	if got, want := marks(t, pool, "offsets"), map[string]int64{"p0": 101, "p1": 1000}; !maps.Equal(got, want) {
		t.Errorf("marks = %v, want %v", got, want)
	}
	if st := s.Stats(); st.Gaps != 0 || st.StuckSenders != 0 {
		t.Errorf("monotonic stats = %+v, want no gaps", st)
	}
}

// TestCacheAnswersDuplicates: once a claim committed, its duplicates are
// answered from the cache with no statement at all; a batch with a key the
// cache cannot answer costs a constant number of statements, whatever its
// size.
func TestCacheAnswersDuplicates(t *testing.T) {
	t.Parallel()
	pool, counter := newPool(t)
	s := newStrategy(t, pool, highwater.Config{})

	var batch []dedupe.Key
	for seq := int64(1); seq <= 200; seq++ {
		for _, sender := range []string{"a", "b", "c", "d", "e"} {
			batch = append(batch, key(sender, seq))
		}
	}
	counter.reset()
	claimTx(t, pool, s, batch, nil)
	if n, rt := counter.statements.Load(), counter.roundTrips.Load(); n != 2 || rt != 1 {
		t.Errorf("a batch of %d keys of new senders took %d statements in %d round trips, want 2 (insert, lock) in 1", len(batch), n, rt)
	}

	counter.reset()
	vs := claimTx(t, pool, s, batch, nil)
	if n := counter.statements.Load(); n != 0 {
		t.Errorf("a batch of cached duplicates ran %d statements, want 0", n)
	}
	for i, v := range vs {
		if v != dedupe.VerdictDuplicate {
			t.Fatalf("key %v: %v, want duplicate", batch[i], v)
		}
	}
	st := s.Stats()
	if st.CacheHits != uint64(len(batch)) || st.CacheMisses != uint64(len(batch)) {
		t.Errorf("stats %+v, want %d hits and %d misses", st, len(batch), len(batch))
	}

	// One key past the cache: the whole batch still costs one locking round
	// trip (no insert: the sender's row is known to exist) and one update.
	counter.reset()
	vs = claimTx(t, pool, s, append(batch, key("c", 201)), nil)
	if vs[len(vs)-1] != dedupe.VerdictNew {
		t.Errorf("c#201: %v, want new", vs[len(vs)-1])
	}
	if n, rt := counter.statements.Load(), counter.roundTrips.Load(); n != 2 || rt != 2 {
		t.Errorf("one uncached key ran %d statements in %d round trips, want 2 (lock, update) in 2", n, rt)
	}
	// Fresh seqs of known and new senders together: insert, lock, update.
	var fresh []dedupe.Key
	for seq := int64(202); seq <= 400; seq++ {
		fresh = append(fresh, key("c", seq), key("f", seq-201))
	}
	counter.reset()
	if vs := claimTx(t, pool, s, fresh, nil); vs[0] != dedupe.VerdictNew || vs[len(vs)-1] != dedupe.VerdictNew {
		t.Errorf("fresh keys: %v … %v", vs[0], vs[len(vs)-1])
	}
	if n, rt := counter.statements.Load(), counter.roundTrips.Load(); n != 3 || rt != 2 {
		t.Errorf("a fresh batch of %d keys ran %d statements in %d round trips, want 3 in 2", len(fresh), n, rt)
	}
	if m := marks(t, pool, "marks"); m["c"] != 400 || m["f"] != 199 {
		t.Errorf("marks %v", m)
	}
	// A pure duplicate that misses the cache costs only the lock.
	s.ResetCache()
	counter.reset()
	if got := verdictNames(claimTx(t, pool, s, keys("a", 7), nil)); got != "duplicate" {
		t.Errorf("a#7 after reset: %s", got)
	}
	if n := counter.statements.Load(); n != 2 {
		t.Errorf("an uncached duplicate of an unknown sender ran %d statements, want 2 (ensure row, lock)", n)
	}
}

// TestCacheNeverRunsAhead: a claim whose transaction rolls back teaches the
// cache nothing, so the redelivered message is new.
func TestCacheNeverRunsAhead(t *testing.T) {
	t.Parallel()
	pool, counter := newPool(t)
	s := newStrategy(t, pool, highwater.Config{})
	ctx := context.Background()
	claimTx(t, pool, s, keys("a", 1, 2), nil)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	vs, err := s.Claim(ctx, tx, keys("a", 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	if got := verdictNames(vs); got != "new new" {
		t.Fatalf("verdicts %q", got)
	}
	if err := tx.Rollback(ctx); err != nil { // the handler failed, say
		t.Fatal(err)
	}

	counter.reset()
	if got := verdictNames(claimTx(t, pool, s, keys("a", 2, 3, 4), nil)); got != "duplicate new new" {
		t.Errorf("after rollback: %q, want duplicate new new", got)
	}
	if counter.statements.Load() == 0 {
		t.Error("new keys were answered without the database")
	}
	if got := marks(t, pool, "marks")["a"]; got != 4 {
		t.Errorf("mark %d, want 4", got)
	}
}

// TestFingerprintOfLastSeq: a redelivery of the mark's own seq with another
// payload is a mismatch, from the database and from the cache; older seqs
// are duplicates whatever their payload (only the last fingerprint is kept).
func TestFingerprintOfLastSeq(t *testing.T) {
	t.Parallel()
	for _, cacheSize := range []int{0, -1} {
		pool, _ := newPool(t)
		s := newStrategy(t, pool, highwater.Config{CacheSize: cacheSize})
		fp := func(k dedupe.Key, payload string) dedupe.Key {
			k.Fingerprint = dedupe.Fingerprint([]byte(payload))
			return k
		}
		claimTx(t, pool, s, []dedupe.Key{fp(key("a", 1), "one"), fp(key("a", 2), "two")}, nil)
		got := verdictNames(claimTx(t, pool, s, []dedupe.Key{
			fp(key("a", 2), "two"), fp(key("a", 2), "TWO"), fp(key("a", 1), "ONE"), key("a", 2),
		}, nil))
		if want := "duplicate mismatch duplicate duplicate"; got != want {
			t.Errorf("cache %d: %q, want %q", cacheSize, got, want)
		}
		// Repeated within one batch: compared with the first occurrence.
		got = verdictNames(claimTx(t, pool, s, []dedupe.Key{
			fp(key("a", 3), "three"), fp(key("a", 3), "three"), fp(key("a", 3), "THREE"),
		}, nil))
		if want := "new duplicate mismatch"; got != want {
			t.Errorf("cache %d: %q, want %q", cacheSize, got, want)
		}
	}
}

// TestInvalidKeys: keys without a sender or with a seq below 1 fail the
// claim with a *dedupe.KeyError naming the reason, before any statement.
func TestInvalidKeys(t *testing.T) {
	t.Parallel()
	pool, counter := newPool(t)
	s := newStrategy(t, pool, highwater.Config{})
	ctx := context.Background()
	for _, tc := range []struct {
		k      dedupe.Key
		reason string
	}{
		{dedupe.Key{Scope: "test", ID: "x", Seq: 1}, "no Sender"},
		{key("a", 0), "at least 1, got 0"},
		{key("a", -3), "negative"},
		{dedupe.Key{Sender: "a", Seq: 1}, "empty scope"},
		{key("a\x00b", 1), "NUL"},
		{key(strings.Repeat("s", 600), 1), "over the limit"},
	} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		counter.reset()
		_, err = s.Claim(ctx, tx, []dedupe.Key{key("ok", 1), tc.k})
		var ke *dedupe.KeyError
		if !errors.As(err, &ke) || !errors.Is(err, dedupe.ErrInvalidKey) || !strings.Contains(ke.Reason, tc.reason) {
			t.Errorf("key %q: error %v, want a KeyError with %q", tc.k, err, tc.reason)
		} else if ke.Key.Sender != tc.k.Sender || ke.Key.Seq != tc.k.Seq {
			t.Errorf("KeyError names %v, want %v", ke.Key, tc.k)
		}
		if n := counter.statements.Load(); n != 0 {
			t.Errorf("key %q: %d statements ran", tc.k, n)
		}
		tx.Rollback(ctx)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for _, cfg := range []highwater.Config{
		{Mode: 7},
		{ReorderWindow: -1},
		{StuckAfter: -1},
		{MaxKeyLen: -1},
		{Table: "t", AdvancesTable: "t"},
		{Table: strings.Repeat("t", 64)},
		{Schema: "a\x00b"},
		{Table: strings.Repeat("t", 45)}, // its advances table's index name would be truncated
	} {
		_, err := highwater.New(cfg)
		var ce *pg.ConfigError
		if !errors.Is(err, pg.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Package != "highwater" {
			t.Errorf("New(%+v) = %v, want a highwater ConfigError", cfg, err)
		}
	}
	s, err := highwater.New(highwater.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Name() != "highwater" || s.Mode() != highwater.Strict {
		t.Errorf("Name %q Mode %v", s.Name(), s.Mode())
	}
	if l := s.Migrations(); len(l) != 1 || l[0].Name != "highwater:marks" {
		t.Errorf("Migrations = %+v", l)
	}
}

// TestQuotedIdentifiers: odd schema and table names are quoted everywhere.
func TestQuotedIdentifiers(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t)
	s := newStrategy(t, pool, highwater.Config{Schema: `Odd "Schema"`, Table: `marks; DROP TABLE x`})
	if got := verdictNames(claimTx(t, pool, s, keys("a", 1, 2, 4), nil)); got != "new new gap" {
		t.Errorf("verdicts %q", got)
	}
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := s.Advance(context.Background(), tx, "test", "a", 3, "lost"); err != nil {
		t.Fatal(err)
	}
	sql, err := pg.MigrationSQL("", s.Migrations()...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"Odd ""Schema"""."marks; DROP TABLE x"`, `"Odd ""Schema"""."marks; DROP TABLE x_advances"`} {
		if !strings.Contains(sql, want) {
			t.Errorf("migration SQL lacks %s:\n%s", want, sql)
		}
	}
}
