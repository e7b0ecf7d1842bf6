package bloom_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/pg"
)

// TestExpiryByPartitionDropWhileConsuming consumes fresh keys and
// redeliveries while RunMaintenance, in two processes at once, creates and
// drops one-second partitions: no claim fails, every redelivery within Retention is a
// duplicate, expired slices leave by partition drop (not by DELETE), and
// the filters rotate out with them.
func TestExpiryByPartitionDropWhileConsuming(t *testing.T) {
	t.Parallel()
	const slice, retention = time.Second, 3 * time.Second
	var logs syncBuffer
	cfg := bloom.Config{Slice: slice, Retention: retention,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	s, pool := setup(t, cfg)
	other := open(t, pool, cfg) // a second process maintaining the same table
	if err := s.Warm(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.RunMaintenance(ctx, pool) })
	wg.Go(func() { _ = other.RunMaintenance(ctx, pool) })
	defer func() { cancel(); wg.Wait() }()

	type batch struct {
		at   time.Time
		keys []dedupe.Key
	}
	var claimed []batch
	first := keyRange("a", 0, 50)
	expectAll(t, "first batch", claim(t, s, pool, first), dedupe.VerdictNew)
	begin := time.Now()
	next := 50
	for time.Since(begin) < retention+2*slice {
		ks := keyRange("a", next, next+50)
		next += 50
		expectAll(t, "fresh batch", claim(t, s, pool, ks), dedupe.VerdictNew)
		claimed = append(claimed, batch{time.Now(), ks})
		// Redeliver a batch claimed well within the retention.
		for i := len(claimed) - 1; i >= 0; i-- {
			if time.Since(claimed[i].at) > retention-slice {
				break
			}
			if time.Since(claimed[i].at) > slice/2 {
				expectAll(t, "redelivery within retention", claim(t, s, pool, claimed[i].keys), dedupe.VerdictDuplicate)
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	wg.Wait()

	if logs.String() != "" {
		t.Fatalf("maintenance by two processes at once logged:\n%s", logs.String())
	}
	st := s.Stats()
	if st.Dropped+other.Stats().Dropped == 0 {
		t.Fatalf("no partition was dropped after %v with a retention of %v: %+v", time.Since(begin), retention, st)
	}
	// Live slices + the ones created ahead + one that may be due to drop.
	if n, max := partitionCount(t, pool, bloom.DefaultTable), int(retention/slice)+1+bloom.DefaultPartitionsAhead+1; n > max {
		t.Fatalf("%d partitions attached, want at most %d", n, max)
	}
	if st.Slices > int64(retention/slice)+3 {
		t.Fatalf("%d slices have filters: expired ones were not rotated out", st.Slices)
	}
	// The first batch's partition is gone, and with it its markers: the
	// keys are new again (the documented meaning of retention).
	expectAll(t, "after expiry", claim(t, s, pool, first), dedupe.VerdictNew)
	if st.Sealed == 0 || st.ProbesSaved == 0 {
		t.Fatalf("no slice was sealed or no probe saved while consuming: %+v", st)
	}
}

// TestClaimWithoutPartition reports the missing maintenance clearly.
func TestClaimWithoutPartition(t *testing.T) {
	t.Parallel()
	pool := pgtestPool(t)
	s, err := bloom.New(bloom.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Migrate(t.Context(), pool, "", s.Migrations()...); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context())
	if _, err := s.Claim(t.Context(), tx, keyRange("a", 0, 2)); !errors.Is(err, bloom.ErrNoPartition) {
		t.Fatalf("got %v, want ErrNoPartition", err)
	}
}
