package highwater_test

import (
	"fmt"
	"testing"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
)

// TestManySendersSmallCache: far more senders than cache entries. The cache
// stays bounded, counts its evictions, and evicted senders are answered
// correctly from the database. (BenchmarkClaimMillionSenders runs a million.)
func TestManySendersSmallCache(t *testing.T) {
	t.Parallel()
	const (
		senders   = 20_000
		cacheSize = 1_000
		batchSize = 2_000
	)
	pool, _ := newPool(t)
	s := newStrategy(t, pool, highwater.Config{CacheSize: cacheSize})
	pass := func(seq int64, want dedupe.Verdict) {
		t.Helper()
		for first := 0; first < senders; first += batchSize {
			batch := make([]dedupe.Key, batchSize)
			for i := range batch {
				batch[i] = key(fmt.Sprintf("sender-%06d", first+i), seq)
			}
			for i, v := range claimTx(t, pool, s, batch, nil) {
				if v != want {
					t.Fatalf("%v: %v, want %v", batch[i], v, want)
				}
			}
		}
	}
	pass(1, dedupe.VerdictNew)
	st := s.Stats()
	if st.CacheEntries != cacheSize || st.CacheEvictions != senders-cacheSize {
		t.Errorf("after %d senders: %+v, want %d entries and %d evictions", senders, st, cacheSize, senders-cacheSize)
	}
	pass(1, dedupe.VerdictDuplicate) // mostly evicted: answered by the database
	pass(2, dedupe.VerdictNew)
	pass(2, dedupe.VerdictDuplicate)
	st = s.Stats()
	if st.CacheEntries != cacheSize || st.CacheMisses == 0 {
		t.Errorf("stats %+v", st)
	}
	// The most recently used senders are still cached: no database.
	recent := make([]dedupe.Key, cacheSize)
	for i := range recent {
		recent[i] = key(fmt.Sprintf("sender-%06d", senders-cacheSize+i), 2)
	}
	hits := st.CacheHits
	claimTx(t, pool, s, recent, nil)
	if got := s.Stats().CacheHits - hits; got != cacheSize {
		t.Errorf("%d cache hits for the %d most recent senders", got, cacheSize)
	}
	m := marks(t, pool, "marks")
	if len(m) != senders {
		t.Fatalf("%d marks, want %d", len(m), senders)
	}
	for sender, mark := range m {
		if mark != 2 {
			t.Fatalf("mark of %s = %d, want 2", sender, mark)
		}
	}
	t.Logf("stats %+v", st)
}
