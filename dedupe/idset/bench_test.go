package idset_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
)

const benchBatch = 500

// BenchmarkClaim claims batches of 500 new keys, one transaction each.
func BenchmarkClaim(b *testing.B) {
	s, pool := newStrategy(b, idset.Config{})
	keys := make([]dedupe.Key, benchBatch)
	n := 0
	for b.Loop() {
		b.StopTimer()
		for i := range keys {
			keys[i] = dedupe.Key{Scope: "bench", ID: fmt.Sprintf("msg-%d", n), Fingerprint: dedupe.Fingerprint(fmt.Appendf(nil, "%d", n))}
			n++
		}
		b.StartTimer()
		claimBatch(b, s, pool, keys, dedupe.VerdictNew)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "keys/s")
}

// BenchmarkClaimDuplicates claims batches of 500 keys that all have markers.
func BenchmarkClaimDuplicates(b *testing.B) {
	s, pool := newStrategy(b, idset.Config{})
	keys := make([]dedupe.Key, benchBatch)
	for i := range keys {
		keys[i] = dedupe.Key{Scope: "bench", ID: fmt.Sprintf("msg-%d", i), Fingerprint: dedupe.Fingerprint(fmt.Appendf(nil, "%d", i))}
	}
	claimBatch(b, s, pool, keys, dedupe.VerdictNew)
	n := 0
	for b.Loop() {
		claimBatch(b, s, pool, keys, dedupe.VerdictDuplicate)
		n += len(keys)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "keys/s")
}

// claimBatch claims keys in a transaction of its own and commits it,
// failing unless every verdict is want.
func claimBatch(b *testing.B, s *idset.Strategy, pool *pgxpool.Pool, keys []dedupe.Key, want dedupe.Verdict) {
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	vs, err := s.Claim(ctx, tx, keys)
	if err != nil {
		_ = tx.Rollback(ctx)
		b.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
	if c := count(vs, want); c != len(keys) {
		b.Fatalf("%d of %d keys %v", c, len(keys), want)
	}
}
