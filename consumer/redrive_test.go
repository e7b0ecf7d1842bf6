package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/jackc/pgx/v5"
)

// fixable is a handler that refuses "bad" payloads permanently until fixed.
type fixable struct {
	fixed atomic.Bool
	calls atomic.Int64
}

func (f *fixable) handle(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	f.calls.Add(1)
	if bytes.HasPrefix(m.Value, []byte("bad")) && !f.fixed.Load() {
		return consumer.Permanent(errors.New("cannot handle " + string(m.Value)))
	}
	return insertEffect(ctx, tx, m)
}

// redriveArgs are Redrive's arguments.
type redriveArgs struct {
	consumer.Config
	Filter parked.Filter
}

func (e *env) redriveConfig(h consumer.Handler) redriveArgs {
	s, err := idset.New(idset.Config{})
	if err != nil {
		e.t.Fatal(err)
	}
	return redriveArgs{Config: consumer.Config{Name: "test", Strategy: s, Handler: h}}
}

func (a redriveArgs) run(e *env) (parked.RedriveResult, error) {
	return consumer.Redrive(context.Background(), e.pool, a.Config, a.Filter)
}

func (e *env) parkedCount() int {
	e.t.Helper()
	return len(e.parked())
}

// lockWaiters counts the sessions of this test's database waiting for a lock.
func (e *env) lockWaiters() int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// A fixed handler applies parked messages once, even when two redrives of
// the same rows run at the same time: the second waits on the row lock of
// the first and then finds the row gone. The original messages, delivered
// again afterwards, are duplicates.
func TestRedriveTwiceAtOnceAppliesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 2})
	const bad = 6
	for i, id := range ids("bad", bad) {
		m := msg(id, "bad "+id)
		m.Headers = []consumer.Header{{Key: "text", Value: []byte("v-" + id)}, {Key: "bin", Value: []byte{0, 0xff, byte(i)}}}
		e.broker.Publish(i%2, m)
	}
	for i, id := range ids("ok", 10) {
		e.broker.Publish(i%2, msg(id, "ok"))
	}
	f := &fixable{}
	c := e.consumer(consumer.Config{Handler: f.handle})
	e.runUntilIdle(c, 30*time.Second)
	if n := e.parkedCount(); n != bad {
		t.Fatalf("parked %d, want %d", n, bad)
	}
	if n := len(e.effectCounts()); n != 10 {
		t.Fatalf("%d effects before the fix, want 10", n)
	}

	f.fixed.Store(true)
	var first atomic.Bool
	var headerErr atomic.Value
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if !first.Swap(true) {
			// Hold this row until the other redrive waits for it.
			deadline := time.Now().Add(20 * time.Second)
			for e.lockWaiters() == 0 {
				if time.Now().After(deadline) {
					return errors.New("the second redrive never waited for the row lock")
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
		if v, _ := m.Header("text"); string(v) != "v-"+m.ID {
			headerErr.Store("text header " + string(v))
		}
		if v, _ := m.Header("bin"); len(v) != 3 || v[0] != 0 || v[1] != 0xff {
			headerErr.Store("binary header lost")
		}
		if m.Ref == "" || m.Lane == "" || m.Source != "test" || m.Attempt != 2 {
			headerErr.Store("message not rebuilt whole")
		}
		return f.handle(ctx, tx, m)
	}
	var wg sync.WaitGroup
	results := make([]parked.RedriveResult, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = e.redriveConfig(h).run(e)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("redrive %d: %v", i, err)
		}
	}
	if v := headerErr.Load(); v != nil {
		t.Fatal(v)
	}
	applied := results[0].Applied + results[1].Applied
	gone := results[0].Gone + results[1].Gone
	if applied != bad || gone < 1 || results[0].Failed+results[1].Failed != 0 {
		t.Fatalf("results %+v / %+v: want %d applied in all and at least one row found gone", results[0], results[1], bad)
	}
	for id, n := range e.effectCounts() {
		if n != 1 {
			t.Errorf("%s applied %d times", id, n)
		}
	}
	if n := len(e.effectCounts()); n != 10+bad {
		t.Fatalf("%d effects after redrive, want %d", n, 10+bad)
	}
	if n := e.parkedCount(); n != 0 {
		t.Fatalf("%d rows still parked", n)
	}

	// The broker delivers the parked messages again: duplicates.
	for _, id := range ids("bad", bad) {
		e.broker.Publish(0, msg(id, "bad "+id))
	}
	before := e.hooks.Total()
	e.runUntilIdle(c, 30*time.Second)
	after := e.hooks.Total()
	if d := after.Duplicate - before.Duplicate; d != bad || after.Applied != before.Applied {
		t.Fatalf("redelivered parked messages: %d duplicates, %d applied; want %d duplicates, none applied", d, after.Applied-before.Applied, bad)
	}
}

// A redrive whose handler still fails leaves the row parked, with its
// attempts and last error updated, and no effect.
func TestRedriveFailureStaysParked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	e.broker.Publish(0, msg("bad-1", "bad one"))
	e.broker.Publish(0, msg("bad-2", "bad two"))
	f := &fixable{}
	c := e.consumer(consumer.Config{Handler: f.handle})
	e.runUntilIdle(c, 30*time.Second)

	res, err := c.Redrive(context.Background(), parked.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed != 2 || res.Applied != 0 || len(res.Items) != 2 || !strings.Contains(res.Items[0].Err.Error(), "cannot handle") {
		t.Fatalf("result %+v", res)
	}
	for _, p := range e.parked() {
		if p.Attempts != 2 || !strings.HasPrefix(p.LastError, "redrive: permanent: cannot handle") {
			t.Errorf("parked row after a failed redrive: %+v", p)
		}
	}
	if n := len(e.effectCounts()); n != 0 {
		t.Fatalf("%d effects", n)
	}
	// Fixed now: a limited redrive applies one, and one stays.
	f.fixed.Store(true)
	res, err = c.Redrive(context.Background(), parked.Filter{Limit: 1})
	if err != nil || res.Applied != 1 || res.Items[0].Ref == "" {
		t.Fatalf("limited redrive: %+v, %v", res, err)
	}
	if got := e.parked(); len(got) != 1 || *got[0].DedupeID != "bad-2" {
		t.Fatalf("left parked: %+v", got)
	}
}

// Messages parked for want of a key are skipped without a KeyFunc; with
// one they are claimed, applied, or found to be duplicates.
func TestRedriveInvalidKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	e.broker.Publish(0, consumer.Message{Value: []byte("k1")})
	e.broker.Publish(0, consumer.Message{Value: []byte("k2")})
	e.broker.Publish(0, msg("k2", "k2"))
	e.runUntilIdle(e.consumer(consumer.Config{}), 30*time.Second)
	if n := e.parkedCount(); n != 2 {
		t.Fatalf("parked %d, want 2", n)
	}
	cfg := e.redriveConfig(insertEffect)
	cfg.Filter.Reason = parked.ReasonInvalidKey
	res, err := cfg.run(e)
	if err != nil || res.Skipped != 2 || !strings.Contains(res.Items[0].Err.Error(), "KeyFunc") {
		t.Fatalf("without KeyFunc: %+v, %v", res, err)
	}
	if n := e.parkedCount(); n != 2 {
		t.Fatalf("skipped rows must stay parked, %d left", n)
	}
	cfg.KeyFunc = func(m *consumer.Message) (dedupe.Key, error) {
		return dedupe.Key{ID: string(m.Value)}, nil
	}
	res, err = cfg.run(e)
	if err != nil || res.Applied != 1 || res.Duplicate != 1 {
		t.Fatalf("with KeyFunc: %+v, %v", res, err)
	}
	if got := e.effectCounts(); got["k2"] != 1 || len(got) != 2 {
		t.Fatalf("effects %v", got)
	}
	if !e.markerExists("test", "k1") || e.parkedCount() != 0 {
		t.Fatal("k1 was not claimed, or rows are left")
	}
}

// Filters by reason and id, and the BatchHandler form.
func TestRedriveFiltersAndBatchHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	e.broker.Publish(0, msg("p1", "bad p1"))
	e.broker.Publish(0, msg("p2", "bad p2"))
	e.broker.Publish(0, msg("p3", "bad p3"))
	e.broker.Publish(0, consumer.Message{Value: []byte("nokey")})
	f := &fixable{}
	e.runUntilIdle(e.consumer(consumer.Config{Handler: f.handle}), 30*time.Second)
	var ids []int64
	if err := pgx.BeginFunc(context.Background(), e.pool, func(tx pgx.Tx) error {
		rows, _ := tx.Query(context.Background(), `SELECT id FROM effectively.parked WHERE reason = 'permanent' ORDER BY id`)
		var err error
		ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	}); err != nil || len(ids) != 3 {
		t.Fatalf("ids %v, %v", ids, err)
	}
	f.fixed.Store(true)
	cfg := e.redriveConfig(nil)
	cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
		if len(msgs) != 1 {
			return errors.New("more than one message")
		}
		return f.handle(ctx, tx, msgs[0])
	}
	// The store's filter selects by source and age too.
	for name, f := range map[string]parked.Filter{
		"another source": {Source: "no-such-source"},
		"older than":     {OlderThan: time.Hour},
	} {
		cfg.Filter = f
		if res, err := cfg.run(e); err != nil || len(res.Items) != 0 {
			t.Fatalf("%s: %+v, %v, want nothing redriven", name, res, err)
		}
	}
	cfg.Filter = parked.Filter{IDs: []int64{ids[1], 999999}, Reason: parked.ReasonPermanent}
	res, err := cfg.run(e)
	if err != nil || res.Applied != 1 || len(res.Items) != 1 || res.Items[0].ID != ids[1] {
		t.Fatalf("by id: %+v, %v", res, err)
	}
	cfg.Filter = parked.Filter{Reason: parked.ReasonPermanent}
	res, err = cfg.run(e)
	if err != nil || res.Applied != 2 {
		t.Fatalf("by reason: %+v, %v", res, err)
	}
	if got := e.parked(); len(got) != 1 || got[0].Reason != parked.ReasonInvalidKey {
		t.Fatalf("left parked: %+v", got)
	}
	// Another scope sees none of these rows.
	cfg.Scope, cfg.Filter = "other", parked.Filter{}
	if res, err := cfg.run(e); err != nil || len(res.Items) != 0 {
		t.Fatalf("other scope: %+v, %v", res, err)
	}
}

func TestRedriveConfigValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{})
	good := e.redriveConfig(insertEffect)
	for name, mutate := range map[string]func(*redriveArgs){
		"no scope":     func(c *redriveArgs) { c.Name = "" },
		"no strategy":  func(c *redriveArgs) { c.Strategy = nil },
		"no handler":   func(c *redriveArgs) { c.Handler = nil },
		"two handlers": func(c *redriveArgs) { c.BatchHandler = insertEffects },
		"limit":        func(c *redriveArgs) { c.Filter.Limit = -1 },
		"older than":   func(c *redriveArgs) { c.Filter.OlderThan = -time.Second },
		"other scope":  func(c *redriveArgs) { c.Filter.Scope = "other" },
	} {
		cfg := good
		mutate(&cfg)
		if _, err := cfg.run(e); !errors.Is(err, consumer.ErrInvalidConfig) {
			t.Errorf("%s: err %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := good.run(e); err == nil || !strings.Contains(err.Error(), "parked") {
		t.Errorf("missing table: err %v", err)
	}
}
