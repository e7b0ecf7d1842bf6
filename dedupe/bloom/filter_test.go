package bloom_test

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
)

// TestSaturatedFilter sizes the filters for 100 keys a slice and pushes
// 20,000 through one slice, so the filter of the current slice (and the one
// Warm loads from the store) answers "maybe" for almost everything. That
// must only cost probes: every new key is still new, every repeat a
// duplicate.
func TestSaturatedFilter(t *testing.T) {
	t.Parallel()
	s, pool := setup(t, bloom.Config{ExpectedKeysPerSlice: 100})
	first := keyRange("sat", 0, 20_000)
	expectAll(t, "first 20,000", claimAll(t, s, pool, first, 1000), dedupe.VerdictNew)
	if err := s.Warm(context.Background(), pool); err != nil { // loads the current slice into the open filter too
		t.Fatal(err)
	}
	st0 := s.Stats()
	fresh := keyRange("sat", 20_000, 40_000)
	expectAll(t, "20,000 new keys through a saturated filter", claimAll(t, s, pool, fresh, 1000), dedupe.VerdictNew)
	st := s.Stats()
	if probes := st.Probes - st0.Probes; probes < int64(len(fresh))*9/10 {
		t.Fatalf("only %d probes for %d keys: the filter is not saturated", probes, len(fresh))
	}
	expectAll(t, "all 40,000 again", claimAll(t, s, pool, append(first, fresh...), 1000), dedupe.VerdictDuplicate)
	if n := markers(t, pool, bloom.DefaultTable); n != 40_000 {
		t.Fatalf("%d markers, want 40,000", n)
	}
}

// TestFalsePositiveRate fills one slice with 20,000 keys, lets it close and
// seal (its filter sized from the 20,000 markers it holds), then claims
// 20,000 other keys: the false-positive rate measured through Stats is
// close to the target (the default).
func TestFalsePositiveRate(t *testing.T) {
	t.Parallel()
	// Partitions for two minutes ahead: the claims run without maintenance,
	// and on a busy machine they outlast half a minute.
	cfg := bloom.Config{Slice: time.Second, Retention: time.Minute, PartitionsAhead: 120}
	s, pool := setup(t, cfg)
	claimAll(t, s, pool, keyRange("fp", 0, 20_000), 1000)
	waitForNextSlice(time.Second)
	if err := s.Maintain(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	st0 := s.Stats()
	expectAll(t, "new keys", claimAll(t, s, pool, keyRange("fp", 100_000, 120_000), 1000), dedupe.VerdictNew)
	st := s.Stats()
	tests := st.Tests - st0.Tests
	fps := st.FalsePositives - st0.FalsePositives
	rate := float64(fps) / float64(tests)
	t.Logf("measured false-positive rate %.4f (%d of %d checks), sealed filters %d bytes for %d keys; overall %.4f",
		rate, fps, tests, st.SealedBytes, st.SealedKeys, st.FalsePositiveRate)
	if tests < 20_000 {
		t.Fatalf("%d checks against sealed filters, want at least 20,000", tests)
	}
	target := bloom.DefaultFalsePositiveRate
	if rate < target/2 || rate > target*3/2 {
		t.Fatalf("measured false-positive rate %.4f, want within %.4f..%.4f of a %v target", rate, target/2, target*3/2, target)
	}
	if st.FalsePositiveRate < target/2 || st.FalsePositiveRate > target*3/2 {
		t.Fatalf("Stats.FalsePositiveRate %.4f, want about %v", st.FalsePositiveRate, target)
	}
	if perKey := float64(st.SealedBytes) / float64(st.SealedKeys); st.SealedKeys != 20_000 || perKey > 1.5 {
		t.Fatalf("sealed filters hold %d keys in %d bytes (%.2f bytes a key), want 20,000 keys at most 1.5 bytes a key",
			st.SealedKeys, st.SealedBytes, perKey)
	}
	if saved := st.ProbesSaved - st0.ProbesSaved; saved < tests*9/10 {
		t.Fatalf("%d probes saved of %d checks", saved, tests)
	}
}
