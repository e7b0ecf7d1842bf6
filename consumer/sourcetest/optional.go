package sourcetest

import (
	"context"
	"slices"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
)

// The checks of the optional interfaces a source may implement (listed in
// package consumer's documentation). Each finds its interface by type
// assertion, as consumer.New does, skips when the source does not
// implement it, and checks what the interface's documentation promises.

// promptly bounds a call that must not block: generous, for a loaded
// machine, and far shorter than a hang.
const promptly = 5 * time.Second

// capability returns the current source as a T, skipping the test when it
// is not one.
func capability[T any](e *env, iface string) T {
	e.Helper()
	c, ok := e.source().(T)
	if !ok {
		e.Skipf("the source (%T) does not implement %s", e.source(), iface)
	}
	return c
}

// settleUp publishes a message and acknowledges it: the source is then set
// up, and has done a delivery's work since the last question asked of it.
func (e *env) settleUp() {
	e.Helper()
	e.drain(10, e.publishN(0, 1))
}

// testHorizon: RedeliveryHorizon returns promptly with a cancelled context
// (an error, or the answer it already has), then a positive duration once
// the source is set up, the same at every call.
func testHorizon(e *env) {
	hs := capability[consumer.HorizonSource](e, "consumer.HorizonSource")
	type answer struct {
		d   time.Duration
		err error
	}
	// First, on a source that has not asked its broker yet.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ch := make(chan answer, 1)
	go func() {
		d, err := hs.RedeliveryHorizon(ctx)
		ch <- answer{d, err}
	}()
	var early answer
	select {
	case early = <-ch:
	case <-time.After(promptly):
		e.Fatalf("RedeliveryHorizon with a cancelled context did not return within %s: a source that cannot ask its broker must say so with an error", promptly)
	}

	e.settleUp()
	ask := func() (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), fetchGuard)
		defer cancel()
		return hs.RedeliveryHorizon(ctx)
	}
	d, err := ask()
	if err != nil {
		e.Fatalf("RedeliveryHorizon of a source set up: %v", err)
	}
	if d <= 0 {
		e.Errorf("RedeliveryHorizon = %s, want a positive duration", d)
	}
	if early.err == nil && early.d != d {
		e.Errorf("RedeliveryHorizon = %s with a cancelled context and no error, then %s", early.d, d)
	}
	for range 3 {
		e.settleUp()
		if again, err := ask(); err != nil || again != d {
			e.Errorf("RedeliveryHorizon = %s, %v after %s: it must not change", again, err, d)
		}
	}
}

// testContentID: ContentIDWindow is never negative and does not change.
func testContentID(e *env) {
	cs := capability[consumer.ContentIDSource](e, "consumer.ContentIDSource")
	w := cs.ContentIDWindow()
	if w < 0 {
		e.Errorf("ContentIDWindow = %s, want 0 (IDs not derived from payloads) or a positive window", w)
	}
	for range 3 {
		e.settleUp()
		if again := cs.ContentIDWindow(); again != w {
			e.Errorf("ContentIDWindow = %s after %s: it must not change", again, w)
		}
	}
}

// testExhaustion: ParkExhausted does not change; when it is false and the
// harness says after how many deliveries the broker moves a message aside
// (Harness.ExhaustedAfter), a message handed back at every delivery is
// never delivered with a higher Attempt: the broker took it.
func testExhaustion(e *env) {
	xs := capability[consumer.ExhaustionSource](e, "consumer.ExhaustionSource")
	park := xs.ParkExhausted()
	for range 3 {
		e.settleUp()
		if again := xs.ParkExhausted(); again != park {
			e.Errorf("ParkExhausted = %v after %v: it must not change", again, park)
		}
	}
	if park {
		e.Skip("ParkExhausted is true: the consumer parks exhausted messages, the source promises nothing more")
	}
	limit := e.h.ExhaustedAfter
	if limit < 1 {
		e.Skip("ParkExhausted is false, and Harness.ExhaustedAfter does not say when the broker moves a message aside")
	}
	target := e.publishN(0, 1)[0]
	deliveries := 0
	for {
		// A redelivery at once is due within the harness's delay; one
		// that is late only ends the loop early, never fails it.
		wait := e.quietWait()
		if deliveries == 0 {
			wait = fetchGuard + e.h.RedeliveryDelay
		}
		b, err := e.tryFetch(context.Background(), 10, wait)
		if err != nil {
			if deliveries == 0 {
				e.Fatalf("Fetch: %v", err)
			}
			return
		}
		var ack []*consumer.Message
		var retry []consumer.Retry
		for _, m := range b.Messages {
			if tag(m) != target {
				ack = append(ack, m)
				continue
			}
			deliveries++
			if m.Attempt > limit {
				e.Errorf("%s delivered with Attempt %d, although ParkExhausted is false and the broker moves a message aside after %d deliveries (Harness.ExhaustedAfter)", target, m.Attempt, limit)
				ack = append(ack, m)
				continue
			}
			retry = append(retry, consumer.Retry{Message: m})
		}
		if err := e.settle(e.source(), b, ack, retry); err != nil {
			e.Errorf("Settle: %v", err)
		}
		if e.Failed() {
			return
		}
	}
}

// testMigrator: the source's migration lines apply through pg.Migrate
// (with the migrations table in pg.DefaultSchema), after which nothing
// is pending, a second Migrate applies nothing, and the source still
// delivers.
func testMigrator(e *env) {
	mig := capability[dedupe.Migrator](e, "dedupe.Migrator")
	if e.b.DB == nil {
		e.Fatal("sourcetest: the source is a dedupe.Migrator, and Broker.DB is nil")
	}
	lines := mig.Migrations()
	if len(lines) == 0 {
		e.Skip("Migrations returned no lines: the source owns no tables in this configuration")
	}
	for _, l := range lines {
		ms, err := l.Render(pg.DefaultSchema)
		switch {
		case l.Name == "":
			e.Errorf("a migration line without a Name")
		case err != nil:
			e.Errorf("line %s: %v", l.Name, err)
		case len(ms) == 0:
			e.Errorf("line %s holds no migrations", l.Name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), fetchGuard)
	defer cancel()
	if _, err := pg.Migrate(ctx, e.b.DB, "", lines...); err != nil {
		e.Fatalf("Migrate: %v", err)
	}
	if pending, err := pg.PendingMigrations(ctx, e.b.DB, "", mig.Migrations()...); err != nil {
		e.Errorf("PendingMigrations: %v", err)
	} else if len(pending) > 0 {
		e.Errorf("after Migrate, %d migrations are still pending (the first: %s %03d_%s)", len(pending), pending[0].Line, pending[0].Version, pending[0].Name)
	}
	applied, err := pg.Migrate(ctx, e.b.DB, "", mig.Migrations()...)
	if err != nil {
		e.Fatalf("Migrate a second time: %v", err)
	}
	if len(applied) > 0 {
		e.Errorf("Migrate a second time applied %d migrations (the first: %s %03d_%s), want none", len(applied), applied[0].Line, applied[0].Version, applied[0].Name)
	}
	e.settleUp()
}

// beforeCommit runs BeforeCommit for b with ack in a transaction and
// commits it (or rolls it back when commit is false), without settling b:
// a crash may follow.
func (e *env) beforeCommit(txs consumer.TxSource, b *consumer.Batch, ack []*consumer.Message, commit bool) {
	e.Helper()
	if e.b.DB == nil {
		e.Fatal("sourcetest: the source is a consumer.TxSource, and Broker.DB is nil")
	}
	ctx := context.Background()
	tx, err := e.b.DB.Begin(ctx)
	if err != nil {
		e.Fatalf("begin: %v", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := txs.BeforeCommit(ctx, tx, b, ack); err != nil {
		e.Fatalf("BeforeCommit: %v", err)
	}
	if !commit {
		return
	}
	if err := tx.Commit(ctx); err != nil {
		e.Fatalf("commit: %v", err)
	}
}

// testTxCommitted: the state BeforeCommit writes commits with the batch
// transaction, so what it acknowledged is not delivered again after a
// crash between the commit and Settle (a restart), nor after the source
// loses its lanes then (a rebalance, when the harness can make one).
func testTxCommitted(e *env) {
	txs := capability[consumer.TxSource](e, "consumer.TxSource")
	crashes := []struct {
		what  string
		crash func() consumer.Source // returns the source of the batch
	}{
		{"a restart", e.restart},
	}
	if e.b.LoseLanes != nil {
		crashes = append(crashes, struct {
			what  string
			crash func() consumer.Source
		}{"a lost lane", func() consumer.Source {
			src := e.source()
			e.b.LoseLanes(e.T, src)
			return src
		}})
	}
	for _, c := range crashes {
		want := e.publishN(0, 4)
		b := e.fetch(10)
		e.beforeCommit(txs, b, b.Messages, true)
		src := c.crash()
		e.mu.Lock()
		for _, m := range b.Messages {
			e.acked[tag(m)] = true // by the transaction, not by Settle
		}
		e.mu.Unlock()
		if err := e.settle(src, b, nil, nil); err != nil {
			e.Errorf("settling a batch after %s: %v, want nil", c.what, err)
		}
		// One more message, for the source to deliver something: an
		// ordered source delivers the committed ones before it if it
		// delivers them again.
		e.drain(10, append(want, e.publishN(0, 1)...))
		e.mu.Lock()
		for _, m := range b.Messages {
			if n := e.seen[tag(m)]; n != 1 && !e.h.Features.Duplicates {
				e.Errorf("%s, acknowledged in a committed transaction, delivered %d times after %s", tag(m), n, c.what)
			}
		}
		e.mu.Unlock()
		e.expectQuiet(e.quietWait(), "every message was acknowledged, some in a committed transaction before "+c.what)
		txs = capability[consumer.TxSource](e, "consumer.TxSource")
	}
}

// testTxRolledBack: what BeforeCommit wrote in a transaction that rolled
// back is gone: the messages it was to acknowledge come back when the
// batch is then abandoned, and after a restart.
func testTxRolledBack(e *env) {
	txs := capability[consumer.TxSource](e, "consumer.TxSource")
	want := e.publishN(0, 4)
	b := e.fetch(10)
	e.beforeCommit(txs, b, b.Messages, false)
	if err := e.settle(e.source(), b, nil, nil); err != nil {
		e.Errorf("Settle abandoning a batch after its transaction rolled back: %v", err)
	}
	left := tags(b.Messages)
	for len(left) > 0 {
		nb, err := e.tryFetch(context.Background(), 10, fetchGuard+e.h.RedeliveryDelay)
		if err != nil {
			e.Fatalf("%v, to be acknowledged only in a transaction that rolled back, did not come back once their batch was abandoned (Fetch: %v)", left, err)
		}
		for _, m := range nb.Messages {
			left = slices.DeleteFunc(left, func(t string) bool { return t == tag(m) })
		}
		e.ack(nb)
	}
	e.drain(10, want)

	want = e.publishN(0, 4)
	b = e.fetch(10)
	e.beforeCommit(txs, b, b.Messages, false)
	old := e.restart()
	if err := e.settle(old, b, nil, nil); err != nil {
		e.Errorf("settling a batch of a closed source: %v, want nil", err)
	}
	got := e.drain(10, want)
	for _, t := range tags(b.Messages) {
		if !slices.ContainsFunc(got, func(m *consumer.Message) bool { return tag(m) == t }) {
			e.Errorf("%s, acknowledged only in a transaction that rolled back, was not delivered again after a restart", t)
		}
	}
	e.expectQuiet(e.quietWait(), "every message was acknowledged")
}
