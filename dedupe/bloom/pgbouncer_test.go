package bloom_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/pgtest"
)

// Through PgBouncer in transaction pooling, two processes maintain one
// table at once while keys are claimed: every advisory lock the strategy
// takes (the gate between claims and seals, partition
// creation, the turn to drop) is transaction-level, so it cannot be left
// behind on a server connection the pooler hands to someone else. No
// maintenance or warm-up fails, expired partitions are dropped, and a
// redelivery within the retention is a duplicate.
func TestMaintenanceThroughPgBouncer(t *testing.T) {
	t.Parallel()
	const slice, retention = time.Second, 2 * time.Second
	var logs syncBuffer
	cfg := bloom.Config{Slice: slice, Retention: retention,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	pool := pgtest.NewBouncerPool(t, nil)
	s := open(t, pool, cfg)
	other := open(t, pool, cfg) // a second process maintaining the same table
	if err := s.Warm(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.RunMaintenance(ctx, pool) })
	wg.Go(func() { _ = other.RunMaintenance(ctx, pool) })
	defer func() { cancel(); wg.Wait() }()

	first := keyRange("a", 0, 50)
	expectAll(t, "first batch", claim(t, s, pool, first), dedupe.VerdictNew)
	begin := time.Now()
	next := 50
	var previous []dedupe.Key
	for time.Since(begin) < retention+2*slice {
		ks := keyRange("a", next, next+50)
		next += 50
		expectAll(t, "fresh batch", claim(t, s, pool, ks), dedupe.VerdictNew)
		if previous != nil {
			expectAll(t, "redelivery", claim(t, other, pool, previous), dedupe.VerdictDuplicate)
		}
		previous = ks
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	if logs.String() != "" {
		t.Fatalf("maintenance by two processes through PgBouncer logged:\n%s", logs.String())
	}
	if s.Stats().Dropped+other.Stats().Dropped == 0 {
		t.Fatalf("no partition was dropped after %v with a retention of %v", time.Since(begin), retention)
	}
	expectAll(t, "after expiry", claim(t, s, pool, first), dedupe.VerdictNew)
}
