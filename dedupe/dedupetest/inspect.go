package dedupetest

import (
	"context"
	"errors"
	"sort"

	"github.com/effectively-once/effectively/dedupe"
)

// inspector returns the strategy as a dedupe.Inspector, skipping the test
// when it is not one.
func (e *env) inspector() dedupe.Inspector {
	e.Helper()
	insp, ok := e.s.(dedupe.Inspector)
	if !ok {
		e.Skipf("%s does not implement dedupe.Inspector", e.s.Name())
	}
	return insp
}

func (e *env) stats(insp dedupe.Inspector, scope string) dedupe.MarkerStats {
	e.Helper()
	st, err := insp.MarkerStats(context.Background(), e.pool, scope)
	if err != nil {
		e.Fatalf("MarkerStats(%q): %v", scope, err)
	}
	return st
}

// scopesOf returns the scopes st reports, by name, failing the test when
// they are not in order, repeated, or without markers.
func (e *env) scopesOf(st dedupe.MarkerStats) map[string]dedupe.ScopeMarkers {
	e.Helper()
	out := map[string]dedupe.ScopeMarkers{}
	if !sort.SliceIsSorted(st.Scopes, func(i, j int) bool { return st.Scopes[i].Scope < st.Scopes[j].Scope }) {
		e.Errorf("MarkerStats: scopes not ordered by scope: %+v", st.Scopes)
	}
	for _, sm := range st.Scopes {
		if _, dup := out[sm.Scope]; dup {
			e.Errorf("MarkerStats: scope %q reported twice", sm.Scope)
		}
		if sm.Markers <= 0 {
			e.Errorf("MarkerStats: scope %q reported with %d markers", sm.Scope, sm.Markers)
		}
		if sm.Oldest != nil && sm.Newest != nil && sm.Newest.Before(*sm.Oldest) {
			e.Errorf("MarkerStats: scope %q: newest %v before oldest %v", sm.Scope, *sm.Newest, *sm.Oldest)
		}
		out[sm.Scope] = sm
	}
	return out
}

// MarkerStats names the strategy and its existing tables, reports the
// scopes of committed claims only (not of rolled-back ones), with at least
// one and at most as many markers as keys claimed, and honours the scope
// filter.
func testInspectorStats(e *env) {
	insp := e.inspector()
	st := e.stats(insp, "")
	if st.Strategy != e.s.Name() || st.Table == "" || len(st.Tables) == 0 {
		e.Fatalf("MarkerStats of a fresh store: strategy %q (want %q), table %q, tables %+v", st.Strategy, e.s.Name(), st.Table, st.Tables)
	}
	for _, t := range st.Tables {
		if !t.Exists || t.Table == "" || t.Bytes < 0 {
			e.Errorf("MarkerStats: table %+v of a migrated store", t)
		}
	}
	if len(st.Scopes) != 0 {
		e.Errorf("MarkerStats of a fresh store reports scopes %+v", st.Scopes)
	}

	e.claim(e.keys("inspect-a", 0, 5))
	e.claim(e.keys("inspect-b", 0, 3))
	e.claimRollback(e.keys("inspect-c", 0, 4))

	got := e.scopesOf(e.stats(insp, ""))
	for scope, n := range map[string]int64{"inspect-a": 5, "inspect-b": 3} {
		sm, ok := got[scope]
		if !ok {
			e.Errorf("MarkerStats: scope %s with committed markers is missing: %+v", scope, got)
			continue
		}
		if sm.Markers > n {
			e.Errorf("MarkerStats: scope %s has %d markers for %d keys claimed", scope, sm.Markers, n)
		}
	}
	if _, ok := got["inspect-c"]; ok || len(got) != 2 {
		e.Errorf("MarkerStats reports scopes %+v, want inspect-a and inspect-b (inspect-c rolled back)", got)
	}
	if one := e.scopesOf(e.stats(insp, "inspect-b")); len(one) != 1 || one["inspect-b"].Markers == 0 {
		e.Errorf("MarkerStats(inspect-b) reports %+v, want inspect-b alone", one)
	}
	if none := e.stats(insp, "inspect-none").Scopes; len(none) != 0 {
		e.Errorf("MarkerStats of a scope without markers reports %+v", none)
	}
}

// SweepExpired either says the markers do not expire, or sweeps: a dry run
// removes nothing, and neither removes markers younger than the retention.
func testInspectorSweep(e *env) {
	insp := e.inspector()
	ctx := context.Background()
	keys := e.keys("sweep", 0, 10)
	e.expect("first claim", keys, e.claim(keys), all(dedupe.VerdictNew, len(keys))...)
	before := e.scopesOf(e.stats(insp, "sweep"))["sweep"]

	plan, err := insp.SweepExpired(ctx, e.pool, true)
	if errors.Is(err, dedupe.ErrNoSweep) {
		if _, err := insp.SweepExpired(ctx, e.pool, false); !errors.Is(err, dedupe.ErrNoSweep) {
			e.Errorf("SweepExpired: the dry run says the markers do not expire, the sweep returns %v", err)
		}
		return
	}
	if err != nil {
		e.Fatalf("SweepExpired (dry run): %v", err)
	}
	if plan.Removed != 0 || plan.Summary == "" || plan.Table == "" || plan.Unit == "" {
		e.Errorf("SweepExpired (dry run) of fresh markers: %+v, want nothing to remove, and a table, unit and summary", plan)
	}
	if after := e.scopesOf(e.stats(insp, "sweep"))["sweep"]; after.Markers != before.Markers {
		e.Errorf("a dry run changed the markers: %d before, %d after", before.Markers, after.Markers)
	}
	res, err := insp.SweepExpired(ctx, e.pool, false)
	if err != nil {
		e.Fatalf("SweepExpired: %v", err)
	}
	if res.Removed != 0 || res.Summary == "" {
		e.Errorf("SweepExpired of fresh markers: %+v, want nothing removed and a summary", res)
	}
	e.expect("claim after the sweep", keys, e.claim(keys), all(dedupe.VerdictDuplicate, len(keys))...)
}
