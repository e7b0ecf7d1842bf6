package dedupetest_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
)

// Broken optional interfaces: idset (or highwater) with one optional
// interface added or gone wrong, each caught by that interface's subtest.
func init() {
	for name, b := range map[string]brokenCase{
		// CheckKey accepts keys that Claim refuses.
		"lenient": {wrap: func(s *idset.Strategy) dedupe.Strategy { return lenient{s} }, catches: []string{"KeyChecker"}},
		// CheckKey refuses with a plain error, not a *dedupe.KeyError.
		"untyped": {wrap: func(s *idset.Strategy) dedupe.Strategy { return untyped{s} }, catches: []string{"KeyChecker"}},
		// Sequenced changes its mind.
		"fickle": {wrap: func(s *idset.Strategy) dedupe.Strategy { return &fickle{Strategy: s} }, catches: []string{"Sequencer"}},
		// Sequenced is false, but a later seq hides an earlier one.
		"hiding": {hw: func(s *highwater.Strategy) dedupe.Strategy { return hiding{s} }, catches: []string{"Sequencer"}},
		// A cache that learns at claim time, so a rollback poisons it.
		"eager": {wrap: func(s *idset.Strategy) dedupe.Strategy { return newCached(s, true) }, catches: []string{"Committer"}},
		// A cache that trusts itself: what it was not told of is new.
		"trusting": {wrap: func(s *idset.Strategy) dedupe.Strategy { return newCached(s, false) }, catches: []string{"Committer"}},
		// Markers that expire at once.
		"timeless": {wrap: func(s *idset.Strategy) dedupe.Strategy { return timeless{s} }, catches: []string{"Retainer"}},
		// A retention that the sweep does not use.
		"twofaced": {wrap: func(s *idset.Strategy) dedupe.Strategy { return twofaced{s} }, catches: []string{"Retainer"}},
		// Migrations that create nothing.
		"hollow": {wrap: func(s *idset.Strategy) dedupe.Strategy { return hollow{s} }, catches: []string{"Migrator"}},
		// Migrations renamed on every call, so they apply again.
		"renaming": {wrap: func(s *idset.Strategy) dedupe.Strategy { return &renaming{Strategy: s} }, catches: []string{"Migrator"}},
		// Maintain that fails the second time.
		"once": {wrap: func(s *idset.Strategy) dedupe.Strategy { return once{s} }, catches: []string{"Maintainer"}},
		// Maintain that deletes live markers.
		"truncating": {wrap: func(s *idset.Strategy) dedupe.Strategy { return truncating{s} }, catches: []string{"Maintainer"}},
		// RunMaintenance that ignores its context.
		"deafmaint": {wrap: func(s *idset.Strategy) dedupe.Strategy { return deafMaint{s} }, catches: []string{"Maintainer"}},
		// Warm that ignores its context.
		"deafwarm": {wrap: func(s *idset.Strategy) dedupe.Strategy { return deafWarm{s} }, catches: []string{"Warmer"}},
		// Warm that leaves the strategy forgetting every marker.
		"amnesiac": {wrap: func(s *idset.Strategy) dedupe.Strategy { return &amnesiac{Strategy: s} }, catches: []string{"Warmer"}},
	} {
		broken[name] = b
	}
}

type lenient struct{ *idset.Strategy }

func (lenient) CheckKey(dedupe.Key) error { return nil }

type untyped struct{ *idset.Strategy }

func (untyped) CheckKey(k dedupe.Key) error {
	if err := dedupe.Validate(k, 0); err != nil {
		return errors.New(err.Error())
	}
	if k.ID == "" {
		return errors.New("empty id")
	}
	return nil
}

type fickle struct {
	*idset.Strategy
	n atomic.Int64
}

func (f *fickle) Sequenced() bool { return f.n.Add(1)%7 == 0 }

type hiding struct{ *highwater.Strategy }

func (hiding) Sequenced() bool { return false }

// cached answers duplicates from a set of keys it knows are committed.
type cached struct {
	*idset.Strategy
	eager bool // learn at claim time instead of from Committed
	mu    sync.Mutex
	known map[[2]string]bool
}

func newCached(s *idset.Strategy, eager bool) *cached {
	return &cached{Strategy: s, eager: eager, known: map[[2]string]bool{}}
}

func (c *cached) Claim(ctx context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	vs, err := c.Strategy.Claim(ctx, tx, keys)
	if err != nil {
		return vs, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, k := range keys {
		id := [2]string{k.Scope, k.ID}
		switch {
		case c.eager && c.known[id]:
			vs[i] = dedupe.VerdictDuplicate
		case c.eager:
			c.known[id] = true
		case vs[i] == dedupe.VerdictDuplicate && !c.known[id]:
			vs[i] = dedupe.VerdictNew // not in the cache: "new"
		}
	}
	return vs, nil
}

func (c *cached) Committed(keys []dedupe.Key, vs []dedupe.Verdict) {
	if c.eager {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, k := range keys {
		if vs[i] == dedupe.VerdictNew {
			c.known[[2]string{k.Scope, k.ID}] = true
		}
	}
}

type timeless struct{ *idset.Strategy }

func (timeless) Retention() time.Duration { return 0 }

type twofaced struct{ *idset.Strategy }

func (t twofaced) Retention() time.Duration { return 2 * t.Strategy.Retention() }

type hollow struct{ *idset.Strategy }

func (hollow) Migrations() []pg.Line {
	return []pg.Line{{Name: "idset:hollow", FS: fstest.MapFS{"001_nothing.sql": {Data: []byte("SELECT 1;")}}}}
}

type renaming struct {
	*idset.Strategy
	n atomic.Int64
}

func (r *renaming) Migrations() []pg.Line {
	ls := r.Strategy.Migrations()
	for i := range ls {
		ls[i].Name += string(rune('a' + r.n.Add(1)%26))
	}
	return ls
}

type once struct{ *idset.Strategy }

func (once) Maintain(ctx context.Context, db pg.DB) error {
	_, err := db.Exec(ctx, `CREATE TABLE effectively.maintained (at timestamptz)`)
	return err
}

type truncating struct{ *idset.Strategy }

func (truncating) Maintain(ctx context.Context, db pg.DB) error {
	_, err := db.Exec(ctx, `DELETE FROM effectively.processed`)
	return err
}

type deafMaint struct{ *idset.Strategy }

func (deafMaint) RunMaintenance(context.Context, pg.DB) error { select {} }

type deafWarm struct{ *idset.Strategy }

func (deafWarm) Warm(context.Context, pg.DB) error { select {} }

// amnesiac, once warmed, calls every duplicate new.
type amnesiac struct {
	*idset.Strategy
	warm atomic.Bool
}

func (a *amnesiac) Warm(context.Context, pg.DB) error { a.warm.Store(true); return nil }

func (a *amnesiac) Claim(ctx context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	vs, err := a.Strategy.Claim(ctx, tx, keys)
	if err == nil && a.warm.Load() {
		fill(vs, dedupe.VerdictNew)
	}
	return vs, err
}
