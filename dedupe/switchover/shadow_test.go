package switchover_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/switchover"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

// syncBuffer is a bytes.Buffer for a logger written from several
// goroutines.
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

// A scripted sequence: the live verdicts stand, every disagreement is
// counted by its pair of verdicts and reported, the shadow learns the
// traffic from its own markers (which roll back with the batch), and a
// shadow that fails or refuses a key changes nothing.
func TestShadowCountsDisagreements(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	live, sh := newIDSet(t), newBloom(t)
	prepare(t, pool, live)
	prepare(t, pool, sh)
	k := func(i int) dedupe.Key { return key("orders", "s", i) }
	claim(t, pool, live, k(1), k(2)) // processed before the shadow started

	var got []switchover.Disagreement
	var logs syncBuffer
	s, err := switchover.NewShadow(switchover.ShadowConfig{
		Live: live, Shadow: sh,
		OnDisagree: func(d switchover.Disagreement) { got = append(got, d) },
		Logger:     slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	st := s.Strategy()
	if st.Name() != "idset" {
		t.Errorf("Name() = %q, want the live strategy's", st.Name())
	}
	if _, ok := st.(dedupe.Retainer); !ok {
		t.Error("the shadow of idset is not a Retainer")
	}
	if _, ok := st.(dedupe.KeyChecker); ok {
		t.Error("the shadow of idset is a KeyChecker, which idset is not")
	}

	steps := []struct {
		what string
		keys []dedupe.Key
		want []dedupe.Verdict // the live verdicts
	}{
		{"the shadow has not seen 1", []dedupe.Key{k(1), k(3)}, []dedupe.Verdict{vDup, vNew}},
		{"now it has", []dedupe.Key{k(1), k(3), k(2)}, []dedupe.Verdict{vDup, vDup, vDup}},
	}
	for _, step := range steps {
		if g, w := verdicts(claim(t, pool, st, step.keys...)...), verdicts(step.want...); g != w {
			t.Errorf("%s: Claim = %s, want the live %s", step.what, g, w)
		}
	}
	// A batch that rolls back takes the shadow's markers with it.
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Claim(ctx, tx, []dedupe.Key{k(4)}); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if g := verdicts(claim(t, pool, st, k(4))...); g != verdicts(vNew) {
		t.Errorf("after a rolled-back claim: %s, want [new]", g)
	}

	want := []switchover.Disagreement{{Key: k(1), Live: vDup, Shadow: vNew}, {Key: k(2), Live: vDup, Shadow: vNew}}
	if len(got) != len(want) || got[0].Key.ID != want[0].Key.ID || got[0].Live != vDup || got[0].Shadow != vNew ||
		got[1].Key.ID != want[1].Key.ID || got[1].Live != vDup || got[1].Shadow != vNew {
		t.Errorf("OnDisagree got %+v, want %+v", got, want)
	}
	stats := s.Stats()
	if stats.Keys != 7 || stats.Compared != 7 || stats.Disagreements != 2 || stats.Errors != 0 ||
		stats.Pairs[vDup][vNew] != 2 || stats.Pairs[vNew][vNew] != 3 || stats.Pairs[vDup][vDup] != 2 {
		t.Errorf("Stats = %+v", stats)
	}
	if l := logs.String(); !strings.Contains(l, "disagrees") || !strings.Contains(l, "orders/s#1") || !strings.Contains(l, "would_apply_again=1") {
		t.Errorf("no log line with a sample of the disagreement:\n%s", l)
	}
}

// A shadow strategy that fails (here, a bloom strategy whose partitions
// were never made) or refuses keys never changes a live verdict nor
// breaks the transaction: the batch commits with the live markers.
func TestShadowFailuresChangeNothing(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	live := newIDSet(t)
	prepare(t, pool, live)
	broken, err := bloom.New(bloom.Config{Slice: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Migrate(context.Background(), pool, "", broken.Migrations()...); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	s, err := switchover.NewShadow(switchover.ShadowConfig{Live: live, Shadow: broken, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	k := func(i int) dedupe.Key { return key("orders", "s", i) }
	if g := verdicts(claim(t, pool, s.Strategy(), k(1), k(2))...); g != verdicts(vNew, vNew) {
		t.Errorf("Claim = %s, want the live [new new]", g)
	}
	if g := verdicts(claim(t, pool, s.Strategy(), k(1))...); g != verdicts(vDup) {
		t.Errorf("Claim = %s, want the live [duplicate]: the first batch committed", g)
	}
	st := s.Stats()
	if st.Errors != 2 || !errors.Is(st.LastError, bloom.ErrNoPartition) || st.Compared != 0 {
		t.Errorf("Stats = %+v, want 2 errors of a missing partition and nothing compared", st)
	}
	if l := logs.String(); !strings.Contains(l, "live verdicts stand") || !strings.Contains(l, "level=WARN") {
		t.Errorf("the shadow's failure was not logged:\n%s", l)
	}

	// highwater in the shadow refuses keys without a sender: they are not
	// claimed by it, and counted.
	hs, err := switchover.NewShadow(switchover.ShadowConfig{Live: live, Shadow: newHighwater(t), LogEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	prepare(t, pool, hs.Strategy())
	noSender := dedupe.Key{Scope: "orders", ID: "plain"}
	if g := verdicts(claim(t, pool, hs.Strategy(), noSender, k(3))...); g != verdicts(vNew, vNew) {
		t.Errorf("Claim = %s, want [new new]", g)
	}
	if st := hs.Stats(); st.Refused != 1 || st.Compared != 1 || st.Errors != 0 || st.Disagreements != 0 {
		t.Errorf("Stats = %+v, want 1 refused, 1 compared", st)
	}
}

// Through a consumer under redelivery, the Shadow's outcomes are the live
// strategy's: every message applied once. A bloom shadow that starts with
// the live idset store agrees with it on every key.
func TestShadowOutcomesAreTheLiveOnes(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	broker := consumertest.New(consumertest.Config{Lanes: lanes, DuplicateRate: 0.3, LostAckRate: 0.1, Seed: 3})
	for seq := 1; seq <= perLane; seq++ {
		for lane := range lanes {
			broker.Publish(lane, seqMessage(lane, seq))
		}
	}
	s, err := switchover.NewShadow(switchover.ShadowConfig{Live: newIDSet(t), Shadow: newBloom(t), LogEvery: -1})
	if err != nil {
		t.Fatal(err)
	}
	hooks := &consumertest.Counter{}
	c := consumertest.NewConsumer(t, pool, broker, consumer.Config{
		Name: consumerOf, Strategy: s.Strategy(), KeyFunc: bothKey, Handler: applyEffect, BatchSize: 10,
		Hooks: []consumer.Hook{hooks}, Logger: consumertest.Logger(),
	})
	consumertest.RunUntilIdle(t, c, broker, 2*time.Minute)
	counts := consumertest.EffectCounts(t, pool, effectTable, "msg_id")
	for id, n := range counts {
		if n != 1 {
			t.Errorf("%s applied %d times", id, n)
		}
	}
	if len(counts) != lanes*perLane {
		t.Errorf("%d messages applied, want %d", len(counts), lanes*perLane)
	}
	tot := hooks.Total()
	st := s.Stats()
	if tot.Duplicate == 0 || broker.Stats().LostAcks == 0 {
		t.Fatalf("no duplicates (%v): the run does not test dedupe", tot)
	}
	if st.Disagreements != 0 || st.Errors != 0 || st.Compared != st.Keys || st.Keys < uint64(tot.Size) {
		t.Errorf("Stats = %+v after %v: want every key compared and no disagreement", st, tot)
	}
	if st.Pairs[vDup][vDup] == 0 || st.Pairs[vNew][vNew] < uint64(lanes*perLane) {
		t.Errorf("Stats.Pairs = %v", st.Pairs)
	}
}
