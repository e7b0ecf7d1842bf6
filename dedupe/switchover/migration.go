package switchover

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
)

// oldSavepoint is the savepoint under which the old strategy claims, and
// which is always rolled back.
const oldSavepoint = "effectively_switchover_old"

// Migration moves a consumer from one dedupe strategy to another without a
// window of doubles. Its Strategy claims every key with the new strategy,
// except the keys the old strategy's store already knows, which are
// duplicates (or mismatches) whatever the new store says; from Config.Until
// on, the old store is no longer consulted and can be dropped.
//
// Give the consumer Strategy(), not the Migration. A Migration is safe for
// concurrent use.
type Migration struct {
	cfg      Config
	core     *migration
	strategy dedupe.Strategy
}

// New returns a Migration for cfg, or a *pg.ConfigError (matching
// pg.ErrInvalidConfig) for a bad value. It logs when the old store is
// consulted until, or that it is no longer consulted.
func New(cfg Config) (*Migration, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &migration{
		pair: pair{first: cfg.Old, second: cfg.New, role: [2]string{"old", "new"}, log: cfg.Logger},
		old:  cfg.Old, nw: cfg.New, until: cfg.Until, now: cfg.Now,
		name: cfg.Old.Name() + "->" + cfg.New.Name(),
	}
	c.committer, _ = cfg.New.(dedupe.Committer)
	if sq, ok := cfg.New.(dedupe.Sequencer); ok {
		c.sequenced = sq.Sequenced()
	}
	r, _ := cfg.New.(dedupe.Retainer)
	m := &Migration{cfg: cfg, core: c, strategy: assemble(c, checkers(cfg.New, cfg.Old), r)}
	if st := m.Status(); st.Consulting {
		cfg.Logger.Info("switchover: keys the new strategy does not know are looked up in the old strategy's store until "+
			st.Until.Format(time.RFC3339)+"; its store can be dropped after that",
			"old", cfg.Old.Name(), "new", cfg.New.Name(), "until", st.Until)
		if r, ok := cfg.Old.(dedupe.Retainer); ok && !cfg.Since.IsZero() && cfg.Until.Before(cfg.Since.Add(r.Retention())) {
			cfg.Logger.Warn("switchover: Until is earlier than Since plus the old strategy's retention: a message the old strategy marked just before the switch and redelivered after Until is applied again",
				"since", cfg.Since, "until", cfg.Until, "old_retention", r.Retention())
		}
	} else {
		c.ended.Store(true)
		cfg.Logger.Info("switchover: the old strategy's store is past Until and no longer consulted: configure the new strategy alone and drop the old store",
			"old", cfg.Old.Name(), "new", cfg.New.Name(), "until", st.Until)
	}
	return m, nil
}

// Strategy returns the dedupe.Strategy to give the consumer. It implements
// the optional interfaces of package dedupe as described in the package
// documentation: dedupe.KeyChecker when either strategy does (a key must
// suit both) and dedupe.Retainer when the new one does (its retention).
func (m *Migration) Strategy() dedupe.Strategy { return m.strategy }

// Status is where a Migration stands.
type Status struct {
	// Old and New are the strategies' names.
	Old, New string
	// Since and Until are the configured times (Since may be zero).
	Since, Until time.Time
	// Consulting is true while claims still look keys up in the old store.
	Consulting bool
	// Remaining is how long until the old store is no longer consulted;
	// zero once it is not.
	Remaining time.Duration
}

// Droppable reports whether this process no longer reads the old store.
// Drop it only when every consumer of the scope is past Until, and after
// the consumers are configured with the new strategy alone.
func (s Status) Droppable() bool { return !s.Consulting }

// Status returns where the Migration stands by its clock.
func (m *Migration) Status() Status {
	now := m.cfg.Now()
	st := Status{Old: m.cfg.Old.Name(), New: m.cfg.New.Name(), Since: m.cfg.Since, Until: m.cfg.Until}
	if now.Before(m.cfg.Until) {
		st.Consulting = true
		st.Remaining = m.cfg.Until.Sub(now)
	}
	return st
}

// Stats counts what a Migration's claims did, since New.
type Stats struct {
	// Keys counts the keys claimed.
	Keys uint64
	// Lookups counts the keys looked up in the old store.
	Lookups uint64
	// KnownToOld counts the keys the old store knew: duplicates (or
	// mismatches) that the new store alone would have called new, or
	// that it never saw.
	KnownToOld uint64
}

// Stats returns the Migration's counters.
func (m *Migration) Stats() Stats {
	return Stats{Keys: m.core.keys.Load(), Lookups: m.core.lookups.Load(), KnownToOld: m.core.known.Load()}
}

// migration is the Strategy a Migration hands out, before assemble adds
// KeyChecker and Retainer.
type migration struct {
	pair
	old, nw   dedupe.Strategy
	until     time.Time
	now       func() time.Time
	name      string
	committer dedupe.Committer
	sequenced bool
	ended     atomic.Bool // Until has passed; logged once

	keys, lookups, known atomic.Uint64
}

var _ core = (*migration)(nil)

// Name returns "old->new", such as "idset->bloom".
func (m *migration) Name() string { return m.name }

// Sequenced is the new strategy's (dedupe.Sequencer): the old store gets
// no markers, so only the new strategy's verdicts move with what applies.
func (m *migration) Sequenced() bool { return m.sequenced }

// Claim decides the verdicts of keys. Until Config.Until, the old strategy
// claims them first, under a savepoint that is rolled back, so that its
// store learns nothing; a key whose first occurrence it calls a duplicate
// or a mismatch was processed before the switch and keeps the old
// strategy's verdicts (for every occurrence). The other keys, and all keys
// after Until, are claimed by the new strategy in the same call, and get
// its verdicts. That is at most two strategy claims and two savepoint
// commands, whatever the batch size.
//
// Two transactions claiming one key never both get VerdictNew: a key the
// old store knows is never new, and the others are decided by the new
// strategy, which keeps that promise itself.
func (m *migration) Claim(ctx context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	m.keys.Add(uint64(len(keys)))
	if !m.consulting() {
		return m.nw.Claim(ctx, tx, keys)
	}
	olds, err := m.lookUp(ctx, tx, keys)
	var ke *dedupe.KeyError
	switch {
	case errors.As(err, &ke):
		return nil, ke
	case err != nil:
		return nil, fmt.Errorf("switchover: looking keys up in the old strategy %s: %w", m.old.Name(), err)
	}
	m.lookups.Add(uint64(len(keys)))

	// A key is known when the first occurrence of its identity is a
	// duplicate or a mismatch: a later occurrence may be a duplicate of the
	// first one alone, in this very claim.
	known := make(map[identity]bool, len(keys))
	var rest []dedupe.Key
	var restAt []int
	for i, k := range keys {
		id := identityOf(k)
		kn, seen := known[id]
		if !seen {
			kn = olds[i] == dedupe.VerdictDuplicate || olds[i] == dedupe.VerdictMismatch
			known[id] = kn
		}
		if !kn {
			rest = append(rest, k)
			restAt = append(restAt, i)
		}
	}
	verdicts := olds
	m.known.Add(uint64(len(keys) - len(rest)))
	if len(rest) == 0 {
		return verdicts, nil
	}
	news, err := m.nw.Claim(ctx, tx, rest)
	if err != nil {
		return nil, err
	}
	if len(news) != len(rest) {
		return nil, fmt.Errorf("switchover: the new strategy %s returned %d verdicts for %d keys", m.nw.Name(), len(news), len(rest))
	}
	for j, i := range restAt {
		verdicts[i] = news[j]
	}
	return verdicts, nil
}

// lookUp claims keys with the old strategy under a savepoint that it rolls
// back, and returns its verdicts in the order of keys. Keys with sequence
// numbers are handed to it in sequence order (stably, so a repeated key's
// first occurrence stays first): a sequence strategy then calls a key a
// duplicate only when its seq was at or below its sender's mark before the
// claim, never because a later seq earlier in the batch moved the mark.
func (m *migration) lookUp(ctx context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	ordered, perm := keys, []int(nil)
	if slices.ContainsFunc(keys, func(k dedupe.Key) bool { return k.Sender != "" }) {
		perm = make([]int, len(keys))
		for i := range perm {
			perm[i] = i
		}
		slices.SortStableFunc(perm, func(a, b int) int {
			ka, kb := &keys[a], &keys[b]
			return cmp.Or(cmp.Compare(ka.Scope, kb.Scope), cmp.Compare(ka.Sender, kb.Sender), cmp.Compare(ka.Seq, kb.Seq))
		})
		ordered = make([]dedupe.Key, len(keys))
		for j, i := range perm {
			ordered[j] = keys[i]
		}
	}
	var vs []dedupe.Verdict
	err := savepoint(ctx, tx, oldSavepoint, false, func() error {
		var err error
		vs, err = m.old.Claim(ctx, tx, ordered)
		if err == nil && len(vs) != len(keys) {
			err = fmt.Errorf("%d verdicts for %d keys", len(vs), len(keys))
		}
		return err
	})
	if err != nil || perm == nil {
		return vs, err
	}
	olds := make([]dedupe.Verdict, len(keys))
	for j, i := range perm {
		olds[i] = vs[j]
	}
	return olds, nil
}

// consulting reports whether the old store is still consulted, and logs
// once when it stops being.
func (m *migration) consulting() bool {
	if m.ended.Load() {
		return false
	}
	if m.now().Before(m.until) {
		return true
	}
	if !m.ended.Swap(true) {
		m.log.Info("switchover: Until has passed; the old strategy's store is no longer consulted: configure the new strategy alone and drop the old store once every consumer of the scope is past Until",
			"old", m.old.Name(), "new", m.nw.Name(), "until", m.until)
	}
	return false
}

// Committed tells the new strategy, if it is a dedupe.Committer, about the
// keys that committed as new (dedupe.Committer). Those are exactly the keys
// the new strategy called new: a key the old store knew is never new. The
// other keys are not reported, since some of them the new strategy never
// claimed: its memory may lag behind its store, which is allowed, but never
// runs ahead of it.
func (m *migration) Committed(keys []dedupe.Key, verdicts []dedupe.Verdict) {
	if m.committer == nil {
		return
	}
	n := min(len(keys), len(verdicts))
	ks := make([]dedupe.Key, 0, n)
	vs := make([]dedupe.Verdict, 0, n)
	for i := range n {
		if verdicts[i] == dedupe.VerdictNew {
			ks, vs = append(ks, keys[i]), append(vs, dedupe.VerdictNew)
		}
	}
	if len(ks) > 0 {
		m.committer.Committed(ks, vs)
	}
}

// MarkerStats reports the new strategy's markers (dedupe.Inspector), the
// old strategy's tables after the new one's, and the switch in Details:
// "switchover_old" (its name), "switchover_until", "switchover_consulting"
// and, when the old strategy is a dedupe.Inspector too,
// "switchover_old_table", "switchover_old_markers" (in scope, or in all
// scopes) and "switchover_old_newest" (when its newest marker was written).
func (m *migration) MarkerStats(ctx context.Context, db pg.DB, scope string) (dedupe.MarkerStats, error) {
	insp, ok := m.nw.(dedupe.Inspector)
	if !ok {
		return dedupe.MarkerStats{Strategy: m.name}, fmt.Errorf("switchover: the new strategy %s is not a dedupe.Inspector", m.nw.Name())
	}
	st, err := insp.MarkerStats(ctx, db, scope)
	st.Strategy = m.name
	if st.Details == nil {
		st.Details = map[string]string{}
	}
	st.Details["switchover_old"] = m.old.Name()
	st.Details["switchover_until"] = m.until.Format(time.RFC3339)
	st.Details["switchover_consulting"] = fmt.Sprint(m.now().Before(m.until))
	if err != nil {
		return st, err
	}
	oi, ok := m.old.(dedupe.Inspector)
	if !ok {
		return st, nil
	}
	ost, err := oi.MarkerStats(ctx, db, scope)
	if err != nil {
		return st, fmt.Errorf("switchover: the old strategy's markers: %w", err)
	}
	st.Tables = append(st.Tables, ost.Tables...)
	st.Details["switchover_old_table"] = ost.Table
	var n int64
	var newest *time.Time
	for _, sm := range ost.Scopes {
		n += sm.Markers
		if sm.Newest != nil && (newest == nil || sm.Newest.After(*newest)) {
			newest = sm.Newest
		}
	}
	st.Details["switchover_old_markers"] = fmt.Sprint(n)
	if newest != nil {
		st.Details["switchover_old_newest"] = newest.UTC().Format(time.RFC3339)
	}
	return st, nil
}

// SweepExpired sweeps the new strategy's markers (dedupe.Inspector). The
// old strategy's markers are swept by its own maintenance, which keeps
// running, or by inspecting the old strategy directly.
func (m *migration) SweepExpired(ctx context.Context, db pg.DB, dryRun bool) (dedupe.SweepReport, error) {
	insp, ok := m.nw.(dedupe.Inspector)
	if !ok {
		return dedupe.SweepReport{}, fmt.Errorf("switchover: the new strategy %s is not a dedupe.Inspector: %w", m.nw.Name(), dedupe.ErrNoSweep)
	}
	return insp.SweepExpired(ctx, db, dryRun)
}

// identity is everything a strategy may key a marker by.
type identity struct {
	scope, id, sender string
	seq               int64
}

func identityOf(k dedupe.Key) identity { return identity{k.Scope, k.ID, k.Sender, k.Seq} }
