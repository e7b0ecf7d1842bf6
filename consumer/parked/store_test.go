package parked_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// newStore migrates a parked table with names that need quoting and
// returns its store.
func newStore(t *testing.T) (*parked.Store, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.NewPool(t)
	store := parked.NewStore(pool, "Ops Schema", `dead"letters`)
	if _, err := pg.Migrate(context.Background(), pool, "Ops Schema", store.Line()); err != nil {
		t.Fatal(err)
	}
	return store, pool
}

func insert(t *testing.T, store *parked.Store, pool *pgxpool.Pool, rows ...parked.Row) {
	t.Helper()
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error { return store.InsertTx(context.Background(), tx, rows) })
	if err != nil {
		t.Fatal(err)
	}
}

func str(s string) *string { return &s }

// A row written by InsertTx reads back whole, byte for byte; the same
// message inserted again is counted on its row, another message under the
// same ref gets its own.
func TestParkedStoreRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, pool := newStore(t)
	seq := int64(7)
	when := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	row := parked.Row{
		Consumer: "c", Scope: "s", Sender: str("orders/0"), Seq: &seq, Fingerprint: []byte{1, 2}, HasMarker: true,
		Source: "src\xff", Lane: "lane\x00", Ref: "r\xfe", MsgKey: []byte{}, Payload: nil,
		Headers:     []parked.Header{{Key: "k\xff", Value: []byte{0}}, {Key: "n", Value: nil}, {Key: "t", Value: []byte("v")}},
		MessageTime: when, Attempts: 3, Reason: parked.ReasonMaxAttempts, LastError: "boom\x00",
	}
	insert(t, store, pool, row, row)
	other := row
	other.Payload = []byte("other")
	insert(t, store, pool, row, other)

	got, err := store.List(ctx, parked.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d rows, want 2: %v", len(got), got)
	}
	p := got[0]
	if p.ParkCount != 3 || got[1].ParkCount != 1 {
		t.Errorf("park counts %d and %d, want 3 and 1", p.ParkCount, got[1].ParkCount)
	}
	if p.Source != row.Source || p.Lane != row.Lane || p.Ref != row.Ref || p.MsgKey == nil || len(p.MsgKey) != 0 || p.Payload != nil {
		t.Errorf("message read back as %v", p)
	}
	if len(p.Headers) != 3 || p.Headers[0].Key != "k\xff" || string(p.Headers[0].Value) != "\x00" || p.Headers[1].Value != nil || string(p.Headers[2].Value) != "v" {
		t.Errorf("headers read back as %q", p.Headers)
	}
	if !p.MessageTime.Equal(when) || p.Attempts != 3 || p.LastError != "boom\uFFFD" || !p.HasMarker || p.ParkedAt.IsZero() {
		t.Errorf("row read back as %v (time %v, parked at %v)", p, p.MessageTime, p.ParkedAt)
	}
	k, ok := p.DedupeKey()
	if !ok || k.Sender != "orders/0" || k.Seq != 7 || k.Scope != "s" || string(k.Fingerprint) != "\x01\x02" {
		t.Errorf("key %v, %v", k, ok)
	}
	if byID, err := store.Get(ctx, p.ID); err != nil || byID.ID != p.ID {
		t.Errorf("Get(%d) = %v, %v", p.ID, byID, err)
	}
	if _, err := store.Get(ctx, 999); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("Get of a missing row: %v", err)
	}
}

// Filters select by scope, source, reason, ids, refs, age and limit; Count,
// Delete and CountByReason honour them.
func TestParkedStoreFilters(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, pool := newStore(t)
	mk := func(scope, source, ref, reason string) parked.Row {
		return parked.Row{Consumer: "c", Scope: scope, Source: source, Ref: ref, Payload: []byte(ref), Reason: reason, Attempts: 1}
	}
	insert(t, store, pool,
		mk("a", "kafka", "r1", parked.ReasonPermanent),
		mk("a", "kafka", "r2", parked.ReasonInvalidKey),
		mk("a", "sqs", "r\xff", parked.ReasonPermanent),
		mk("b", "kafka", "r1", parked.ReasonPermanent),
	)
	all, err := store.List(ctx, parked.Filter{})
	if err != nil || len(all) != 4 {
		t.Fatalf("List: %d rows, %v", len(all), err)
	}
	for _, c := range []struct {
		f    parked.Filter
		want int64
	}{
		{parked.Filter{Scope: "a"}, 3},
		{parked.Filter{Scope: "a", Source: "kafka"}, 2},
		{parked.Filter{Reason: parked.ReasonPermanent}, 3},
		{parked.Filter{Refs: []string{"r1"}}, 2},
		{parked.Filter{Refs: []string{"r\xff"}}, 1},
		{parked.Filter{IDs: []int64{all[0].ID, all[3].ID}}, 2},
		{parked.Filter{Limit: 3}, 3},
		{parked.Filter{OlderThan: time.Hour}, 0},
	} {
		n, err := store.Count(ctx, c.f)
		if err != nil || n != c.want {
			t.Errorf("Count(%+v) = %d, %v; want %d", c.f, n, err, c.want)
		}
		ps, err := store.List(ctx, c.f)
		if err != nil || int64(len(ps)) != c.want {
			t.Errorf("List(%+v): %d rows, %v; want %d", c.f, len(ps), err, c.want)
		}
	}
	counts, err := store.CountByReason(ctx, "a")
	if err != nil || len(counts) != 2 || counts[0].Reason != parked.ReasonInvalidKey || counts[0].Rows != 1 || counts[1].Rows != 2 {
		t.Errorf("CountByReason(a) = %+v, %v", counts, err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	has, err := store.HasRefsTx(ctx, tx, "a", "kafka", []string{"r1", "r\xff", "r9"})
	_ = tx.Rollback(ctx)
	if err != nil || len(has) != 1 || !has["r1"] {
		t.Errorf("HasRefsTx = %v, %v; want r1 only", has, err)
	}
	if n, err := store.Delete(ctx, parked.Filter{Scope: "a", Limit: 2}); err != nil || n != 2 {
		t.Errorf("Delete = %d, %v; want 2", n, err)
	}
	if left, _ := store.List(ctx, parked.Filter{}); len(left) != 2 || left[0].Ref != "r\xff" {
		t.Errorf("left after Delete: %v", left)
	}
}

// TakeTx deletes and returns a row, which a concurrent TakeTx then finds
// gone; LockTx with skipLocked passes over it; RecordFailure counts an
// attempt.
func TestParkedStoreTakeAndLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, pool := newStore(t)
	insert(t, store, pool, parked.Row{Consumer: "c", Scope: "s", DedupeID: str("x"), Ref: "r", Reason: parked.ReasonPermanent, Attempts: 1})
	ids, err := store.IDs(ctx, parked.Filter{Scope: "s"})
	if err != nil || len(ids) != 1 {
		t.Fatalf("IDs = %v, %v", ids, err)
	}
	id := ids[0]
	if err := store.RecordFailure(ctx, id, "redrive: again\xff"); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	p, err := store.TakeTx(ctx, tx, "s", id)
	if err != nil || p.Attempts != 2 || p.LastError != "redrive: again\uFFFD" || *p.DedupeID != "x" {
		t.Fatalf("TakeTx = %v, %v", p, err)
	}
	other, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = other.Rollback(ctx) }()
	if _, err := store.LockTx(ctx, other, "s", id, true); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("LockTx skipping a taken row: %v, want ErrNoRows", err)
	}
	if _, err := store.TakeTx(ctx, other, "t", id); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("TakeTx of another scope's row: %v, want ErrNoRows", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := store.TakeTx(ctx, other, "s", id); !errors.Is(err, pgx.ErrNoRows) {
		t.Errorf("TakeTx of a taken row: %v, want ErrNoRows", err)
	}
}
