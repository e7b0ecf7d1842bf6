package bloom_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/pg"
)

// syncBuffer is a bytes.Buffer safe for a logger used from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRestartAndWarm: a new Strategy on the same tables (a restarted
// process) recognises the keys of the one before. Before Warm it answers
// correctly by probing every live partition; after Warm new keys skip the
// probes of closed slices, and old keys are confirmed by the rebuilt
// filters.
func TestRestartAndWarm(t *testing.T) {
	t.Parallel()
	cfg := bloom.Config{Slice: time.Second, Retention: time.Minute, PartitionsAhead: 10}
	before, pool := setup(t, cfg)
	old := keyRange("r", 0, 600)
	expectAll(t, "before the restart", claimAll(t, before, pool, old, 200), dedupe.VerdictNew)
	waitForNextSlice(cfg.Slice) // the old keys' slices close

	var logs syncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	after, err := bloom.New(cfg) // no Maintain, which would seal (warm) too
	if err != nil {
		t.Fatal(err)
	}
	if after.Warmed() {
		t.Fatal("a new strategy claims to be warm")
	}
	// Not warm: every key is probed in every closed live slice.
	expectAll(t, "old keys before Warm", claim(t, after, pool, old[:100]), dedupe.VerdictDuplicate)
	expectAll(t, "new keys before Warm", claim(t, after, pool, keyRange("r", 1000, 1100)), dedupe.VerdictNew)
	st := after.Stats()
	if st.ProbesSaved != 0 || st.Probes < 200*int64(cfg.Retention/cfg.Slice) {
		t.Fatalf("before Warm: %d probes, %d saved; want every key probed in every live slice", st.Probes, st.ProbesSaved)
	}

	// After Warm, new keys skip the probes of every sealed slice. That holds
	// while no slice closes between Warm and the claims (a slice that closes
	// afterwards is unsealed until the next Warm or maintenance); on a busy
	// machine the claims can outlast the slice, so such a round proves
	// nothing and is run again, with a new Warm and new keys.
	for round := 0; ; round++ {
		waitEarlyInSlice(cfg.Slice)
		slice := time.Now().Truncate(cfg.Slice)
		if err := after.Warm(context.Background(), pool); err != nil {
			t.Fatal(err)
		}
		if !after.Warmed() {
			t.Fatal("not warm after Warm")
		}
		if !strings.Contains(logs.String(), "filters built from the store") || !strings.Contains(logs.String(), "keys=") {
			t.Fatalf("Warm logged no progress:\n%s", logs.String())
		}
		st0 := after.Stats()
		expectAll(t, "old keys after Warm", claimAll(t, after, pool, old, 200), dedupe.VerdictDuplicate)
		fresh := keyRange("r", 2000+1000*round, 2500+1000*round)
		expectAll(t, "new keys after Warm", claim(t, after, pool, fresh), dedupe.VerdictNew)
		st = after.Stats()
		if !time.Now().Truncate(cfg.Slice).Equal(slice) {
			if round == 4 {
				t.Fatalf("five rounds of claims each outlasted their %s slice", cfg.Slice)
			}
			continue
		}
		if got := st.ConfirmedPositives - st0.ConfirmedPositives; got < int64(len(old))-100 {
			// The first 100 old keys may sit in the slice of the unwarmed
			// claims above; the rest must be confirmed by sealed filters.
			t.Fatalf("sealed filters confirmed %d old keys, want at least %d", got, len(old)-100)
		}
		probes := st.Probes - st0.Probes - int64(len(old)) // the old keys' confirmations
		if probes > int64(len(fresh))/5 {
			t.Fatalf("%d probes for %d new keys after Warm: the filters saved nothing", probes, len(fresh))
		}
		break
	}
	if st.FilterBytes == 0 {
		t.Fatal("no filter memory reported")
	}
}

// countingDB counts the transactions run through it: every Begin, and every
// statement run outside one.
type countingDB struct {
	pg.DB
	n atomic.Int64
}

func (c *countingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	c.n.Add(1)
	return c.DB.Begin(ctx)
}

func (c *countingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.n.Add(1)
	return c.DB.Exec(ctx, sql, args...)
}

func (c *countingDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.n.Add(1)
	return c.DB.Query(ctx, sql, args...)
}

func (c *countingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n.Add(1)
	return c.DB.QueryRow(ctx, sql, args...)
}

// TestWarmFewTransactions: with one-second slices and an hour of
// retention, a start-up seals 3,600 live slices. It reads them in a few
// transactions, not one (or more) a slice, and the filters it builds hold
// the markers of every closed slice.
func TestWarmFewTransactions(t *testing.T) {
	t.Parallel()
	cfg := bloom.Config{Slice: time.Second, Retention: time.Hour, PartitionsAhead: 10}
	before, pool := setup(t, cfg)
	ctx := context.Background()
	old := keyRange("w", 0, 300)
	expectAll(t, "before the restart", claimAll(t, before, pool, old, 100), dedupe.VerdictNew)
	waitForNextSlice(cfg.Slice) // the old keys' slices close

	after, err := bloom.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := &countingDB{DB: pool}
	if err := after.Warm(ctx, db); err != nil {
		t.Fatal(err)
	}
	if n := db.n.Load(); n > 4 {
		t.Errorf("Warm of %d live slices ran %d transactions, want at most 4", cfg.Retention/cfg.Slice, n)
	}
	st := after.Stats()
	if st.Sealed < int64(cfg.Retention/cfg.Slice)-2 || st.SealedKeys != int64(len(old)) {
		t.Fatalf("after Warm: %d slices sealed holding %d keys, want about %d slices holding %d",
			st.Sealed, st.SealedKeys, cfg.Retention/cfg.Slice, len(old))
	}
	expectAll(t, "old keys after Warm", claimAll(t, after, pool, old, 100), dedupe.VerdictDuplicate)
	if got := after.Stats().ConfirmedPositives; got != int64(len(old)) {
		t.Fatalf("sealed filters confirmed %d old keys, want %d", got, len(old))
	}
}
