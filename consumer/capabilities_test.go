package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
)

// TestResolveCapabilities: New finds each strategy's and source's optional
// interfaces once, and a source or strategy without them leaves them off.
func TestResolveCapabilities(t *testing.T) {
	t.Parallel()
	must := func(s dedupe.Strategy, err error) dedupe.Strategy {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ids := must(idset.New(idset.Config{}))
	blm := must(bloom.New(bloom.Config{}))
	strict := must(highwater.New(highwater.Config{}))
	mono := must(highwater.New(highwater.Config{Mode: highwater.Monotonic}))

	type want struct{ checker, sequenced, committer, retainer, migrator, maintainer, warmer bool }
	for name, tc := range map[string]struct {
		s dedupe.Strategy
		want
	}{
		"idset":               {ids, want{retainer: true, migrator: true, maintainer: true}},
		"bloom":               {blm, want{committer: true, retainer: true, migrator: true, maintainer: true, warmer: true}},
		"highwater strict":    {strict, want{checker: true, committer: true, migrator: true}},
		"highwater monotonic": {mono, want{checker: true, sequenced: true, committer: true, migrator: true}},
		"bare":                {bareStrategy{}, want{}},
	} {
		c := resolveCapabilities(tc.s, nil)
		got := want{c.checker != nil, c.sequenced, c.committer != nil, c.retainer != nil, c.migrator != nil, c.maintainer != nil, c.warmer != nil}
		if got != tc.want {
			t.Errorf("%s: capabilities %+v, want %+v", name, got, tc.want)
		}
		if c.txsrc != nil || c.horizon != nil || c.contentIDs != nil || c.keepRetrying || c.srcMigrator != nil {
			t.Errorf("%s: source capabilities without a source: %+v", name, c)
		}
	}

	c := resolveCapabilities(ids, fullSource{parkExhausted: false})
	if c.txsrc == nil || c.horizon == nil || c.contentIDs == nil || !c.keepRetrying || c.srcMigrator == nil {
		t.Errorf("full source: %+v", c)
	}
	if c := resolveCapabilities(ids, fullSource{parkExhausted: true}); c.keepRetrying {
		t.Error("a source that parks exhausted messages keeps retrying them")
	}
	if c := resolveCapabilities(ids, bareSource{}); c.txsrc != nil || c.horizon != nil || c.contentIDs != nil || c.keepRetrying || c.srcMigrator != nil {
		t.Errorf("bare source: %+v", c)
	}
}

type bareStrategy struct{}

func (bareStrategy) Name() string { return "bare" }
func (bareStrategy) Claim(context.Context, pgx.Tx, []dedupe.Key) ([]dedupe.Verdict, error) {
	return nil, nil
}

type bareSource struct{}

func (bareSource) Fetch(context.Context, int) (*Batch, error)                { return nil, nil }
func (bareSource) Settle(context.Context, *Batch, []*Message, []Retry) error { return nil }

type fullSource struct {
	bareSource
	parkExhausted bool
}

var (
	_ TxSource         = fullSource{}
	_ HorizonSource    = fullSource{}
	_ ContentIDSource  = fullSource{}
	_ ExhaustionSource = fullSource{}
	_ dedupe.Migrator  = fullSource{}
)

func (fullSource) BeforeCommit(context.Context, pgx.Tx, *Batch, []*Message) error { return nil }
func (fullSource) RedeliveryHorizon(context.Context) (time.Duration, error)       { return time.Hour, nil }
func (fullSource) ContentIDWindow() time.Duration                                 { return time.Minute }
func (s fullSource) ParkExhausted() bool                                          { return s.parkExhausted }
func (fullSource) Migrations() []pg.Line                                          { return nil }
