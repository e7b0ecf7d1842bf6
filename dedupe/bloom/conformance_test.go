package bloom_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/dedupetest"
)

func TestConformance(t *testing.T) {
	dedupetest.Run(t, dedupetest.Harness{
		New: func(t *testing.T) (dedupe.Strategy, *pgxpool.Pool) {
			return setup(t, bloom.Config{})
		},
		Key:          keyOf,
		Fingerprints: true,
	})
}

// TestConformanceWarm runs the suite with warm filters (Warm done before
// the first claim), so new keys skip their probes.
func TestConformanceWarm(t *testing.T) {
	dedupetest.Run(t, dedupetest.Harness{
		New: func(t *testing.T) (dedupe.Strategy, *pgxpool.Pool) {
			s, pool := setup(t, bloom.Config{})
			if err := s.Warm(t.Context(), pool); err != nil {
				t.Fatal(err)
			}
			return s, pool
		},
		Key:          keyOf,
		Fingerprints: true,
	})
}

// TestConformanceShortSlices runs the suite with one-second slices and
// maintenance running, so claims cross slice boundaries, partitions come
// and go, and slices are sealed while the suite claims.
func TestConformanceShortSlices(t *testing.T) {
	dedupetest.Run(t, dedupetest.Harness{
		New: func(t *testing.T) (dedupe.Strategy, *pgxpool.Pool) {
			s, pool := setup(t, bloom.Config{Slice: time.Second, Retention: time.Minute})
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() { _ = s.RunMaintenance(ctx, pool) })
			t.Cleanup(func() { cancel(); wg.Wait() }) // before the pool closes
			return s, pool
		},
		Key:          keyOf,
		Fingerprints: true,
	})
}
