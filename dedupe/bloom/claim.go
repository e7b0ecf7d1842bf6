package bloom

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/effectively-once/effectively/dedupe"
)

type pairKey struct {
	scope, id string
	slice     int64
}

type scopeID struct{ scope, id string }

// marker is what the store said about one distinct key of a batch.
type marker struct {
	found       bool // a marker existed before this claim
	inserted    bool // this claim wrote the marker
	fingerprint []byte
}

// maxReplans bounds how often a claim plans again because the database
// clock left the span it planned for (a slice boundary passed while it
// waited for its locks, or this process's estimate of the clock was off).
const maxReplans = 8

// Claim decides the verdicts of keys and writes the markers of new keys in
// tx, with two statements sent in one round trip whatever the batch size:
// see the package documentation for the protocol. tx must be READ
// COMMITTED. An invalid key (see dedupe.Validate; ID is required) fails the
// whole claim with a *dedupe.KeyError naming it.
func (s *Strategy) Claim(ctx context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	verdicts := make([]dedupe.Verdict, len(keys))
	if len(keys) == 0 {
		return verdicts, nil
	}
	for _, k := range keys {
		if err := dedupe.Validate(k, s.cfg.MaxIDLen); err != nil {
			return nil, err
		}
		if k.ID == "" {
			return nil, &dedupe.KeyError{Key: k, Reason: "empty id: the bloom strategy needs Key.ID"}
		}
	}

	// Distinct keys (their first occurrences), sorted so that concurrent
	// claims of overlapping batches insert their markers in one order: a
	// claim waiting for a key another holds then holds none that the
	// other waits for, and the two cannot deadlock.
	first := make(map[scopeID]int, len(keys))
	uniq := make([]int, 0, len(keys))
	for i, k := range keys {
		u := scopeID{k.Scope, k.ID}
		if _, ok := first[u]; ok {
			continue
		}
		first[u] = i
		uniq = append(uniq, i)
	}
	slices.SortFunc(uniq, func(a, b int) int {
		return cmp.Or(cmp.Compare(keys[a].Scope, keys[b].Scope), cmp.Compare(keys[a].ID, keys[b].ID))
	})
	in := insertArgs{
		scope: make([]string, len(uniq)),
		id:    make([]string, len(uniq)),
		fp:    make([][]byte, len(uniq)),
	}
	for j, i := range uniq {
		in.scope[j], in.id[j], in.fp[j] = keys[i].Scope, keys[i].ID, keys[i].Fingerprint
	}

	// One round trip: the gate and the claim, planned for the slice the
	// database clock is estimated to be in. When this process knows of a
	// barrier in that slice, the gate is taken shared and the claim writes
	// there. Otherwise the claim tries to be the barrier itself (see the
	// package documentation).
	now := s.clockEstimate()
	target := s.sliceOf(now)
	tried := s.sliceOf(time.UnixMicro(s.barrierAt.Load())) != target
	p, err := s.plan(keys, uniq, now, target)
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	if tried {
		b.Queue(gateTrySQL, s.gateKey, s.exclusiveGUC)
	} else {
		b.Queue(gateSharedSQL, s.gateKey)
	}
	b.Queue(s.claimSQLFor(p.target), p.args(in)...)
	br := tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, s.gateErr(err, p.target)
	}
	rows, err := br.Query()
	res, err := s.readClaim(rows, err, p, in)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = s.claimErr(cerr, p.target)
	}
	if err != nil {
		return nil, err
	}
	// Rare: the latest barrier is not in the planned slice (a barrier
	// passed while the claim waited for the gate, a slice boundary passed
	// and no barrier since, or this process had not seen the latest one),
	// or the live window moved; the statement did nothing. Plan again from
	// the clocks it read, under the gate already held: for the barrier's
	// slice, or, once, for the current slice if the gate can be had
	// exclusively without waiting.
	for tries := 0; !res.ran; tries++ {
		if !res.rc {
			return nil, fmt.Errorf("%w (the transaction is %s)", ErrIsolation, isolationOf(ctx, tx))
		}
		if tries == maxReplans {
			return nil, fmt.Errorf("bloom: claim: the database clock left the planned slice %d times in a row", tries)
		}
		target := s.sliceOf(time.UnixMicro(res.barrier))
		upgrade := !tried && target != s.sliceOf(res.now)
		if upgrade {
			tried, target = true, s.sliceOf(res.now)
		}
		if p, err = s.plan(keys, uniq, res.now, target); err != nil {
			return nil, err
		}
		if upgrade {
			b := &pgx.Batch{}
			b.Queue(upgradeSQL, s.gateKey, s.exclusiveGUC)
			b.Queue(s.claimSQLFor(p.target), p.args(in)...)
			br := tx.SendBatch(ctx, b)
			if _, err := br.Exec(); err != nil {
				_ = br.Close()
				return nil, s.gateErr(err, p.target)
			}
			rows, err := br.Query()
			res, err = s.readClaim(rows, err, p, in)
			if cerr := br.Close(); err == nil && cerr != nil {
				err = s.claimErr(cerr, p.target)
			}
			if err != nil {
				return nil, err
			}
			continue
		}
		rows, err := tx.Query(ctx, s.claimSQLFor(p.target), p.args(in)...)
		if res, err = s.readClaim(rows, err, p, in); err != nil {
			return nil, err
		}
	}
	// Keys whose insert conflicted with a marker the statement's snapshot
	// did not see: read them in a new one.
	if err := s.readHeld(ctx, tx, keys, uniq, p, &res); err != nil {
		return nil, err
	}
	marks, st := res.marks, p.st
	st.probes = int64(len(p.scope))
	st.confirmed = res.confirmed
	st.conflicts = res.held

	// Verdicts, in order; a repeat compares with the marker its first
	// occurrence found or wrote.
	var fresh []scopeID
	for i, k := range keys {
		u := scopeID{k.Scope, k.ID}
		m := marks[u]
		if m == nil {
			return nil, fmt.Errorf("bloom: claim: the marker of %s was neither found nor written", k)
		}
		fi := first[u]
		switch {
		case fi == i && m.inserted:
			verdicts[i] = dedupe.VerdictNew
			st.fresh++
			fresh = append(fresh, u)
			continue
		case fi == i:
			// compare with the stored marker below
		case m.inserted:
			m = &marker{found: true, fingerprint: keys[fi].Fingerprint}
		}
		if dedupe.SameFingerprint(m.fingerprint, k.Fingerprint) {
			verdicts[i] = dedupe.VerdictDuplicate
		} else {
			verdicts[i] = dedupe.VerdictMismatch
		}
	}
	st.keys = int64(len(keys))
	s.stats.add(st)
	if !s.cfg.DisableFilter {
		s.written.note(fresh, p.target.Unix())
	}
	return verdicts, nil
}

// insertArgs are the distinct keys of a claim, as claimSQL's arrays.
type insertArgs struct {
	scope, id []string
	fp        [][]byte
}

// claimPlan is what the filters decided for one estimate of the database
// clock: the target slice, the span of clocks for which the plan holds,
// and the (key, slice) pairs to probe.
type claimPlan struct {
	target, end time.Time // the target slice: [target, end)
	lo, hi      time.Time
	scope, id   []string
	slice       []time.Time
	positive    map[pairKey]bool // pairs probed because a sealed filter said "maybe"
	st          claimStats
}

func (p *claimPlan) args(in insertArgs) []any {
	return []any{p.scope, p.id, p.slice, in.scope, in.id, in.fp, p.target, p.lo, p.hi,
		p.target.UnixMicro(), p.end.UnixMicro()}
}

// plan decides which (key, slice) pairs need a probe if the database clock
// reads now and the claim writes to the slice starting at target. The plan
// holds for every clock in [lo, hi), the span with the same oldest live
// slice, and while the latest barrier lies in the target slice.
func (s *Strategy) plan(keys []dedupe.Key, uniq []int, now, target time.Time) (*claimPlan, error) {
	from := s.liveFrom(now)
	if target.Before(from) {
		return nil, fmt.Errorf("bloom: claim: the latest barrier (slice %s) is older than the live window: is maintenance running?",
			target.Format(time.RFC3339))
	}
	p := &claimPlan{
		target:   target,
		end:      target.Add(s.cfg.Slice),
		lo:       from.Add(s.cfg.Retention),
		hi:       from.Add(s.cfg.Retention + s.cfg.Slice),
		positive: map[pairKey]bool{},
	}
	s.filters.mu.RLock()
	defer s.filters.mu.RUnlock()
	window := s.filters.window(from, target, s.cfg.Slice)
	probe := func(k dedupe.Key, t time.Time) {
		p.scope, p.id, p.slice = append(p.scope, k.Scope), append(p.id, k.ID), append(p.slice, t)
	}
	// What each (key, slice) pair needs, key by key and slice by slice:
	// the filter tests are then run together (see testAll), and the
	// probes are sent in this order.
	w := len(window)
	// A scope's filters, and what each slice needs, are the same for all
	// its keys: worked out once per scope.
	type scopeRow struct {
		acts []pairAct
		fi   []int32 // index in fl of the filter to ask
	}
	rows := map[string]*scopeRow{}
	var fl []*bloom.BloomFilter
	rowOf := func(scope string) *scopeRow {
		if r := rows[scope]; r != nil {
			return r
		}
		r := &scopeRow{acts: make([]pairAct, w), fi: make([]int32, w)}
		for j, sf := range window {
			var f *bloom.BloomFilter
			if s.cfg.DisableFilter || sf == nil || !sf.sealed {
				if j < w-1 {
					r.acts[j] = actProbe
					continue
				}
				// The insert finds the current slice's markers by its
				// unique index; an open filter's positive saves the read
				// of a conflict.
				if f = filterOf(sf, scope, s.cfg.DisableFilter); f != nil {
					r.acts[j] = actTestOpen
				}
			} else if f = sf.byScope[scope]; f != nil {
				r.acts[j] = actTestSealed
			}
			if f != nil {
				r.fi[j] = int32(len(fl))
				fl = append(fl, f)
			}
		}
		rows[scope] = r
		return r
	}
	acts := make([]pairAct, len(uniq)*w)
	tests := make([]filterTest, 0, len(uniq)*w)
	for u, i := range uniq {
		r := rowOf(keys[i].Scope)
		copy(acts[u*w:], r.acts)
		for j, a := range r.acts {
			if a == actTestOpen || a == actTestSealed {
				tests = append(tests, filterTest{pair: int32(u*w + j), key: int32(u), filter: r.fi[j]})
			}
		}
	}
	for _, pair := range s.testAll(keys, uniq, fl, tests) {
		acts[pair] |= actHit
	}
	starts := make([]time.Time, w)
	for j := range starts {
		starts[j] = from.Add(time.Duration(j) * s.cfg.Slice)
	}
	for u, i := range uniq {
		k := keys[i]
		for j, t := range starts {
			switch acts[u*w+j] {
			case actProbe, actTestOpen | actHit:
				probe(k, t)
			case actTestSealed | actHit:
				p.st.tests++
				p.st.positives++
				p.positive[pairKey{k.Scope, k.ID, t.Unix()}] = true
				probe(k, t)
			case actTestSealed:
				p.st.tests++
				p.st.saved++
			}
		}
	}
	return p, nil
}

// pairAct is what a claim plan does for one (key, slice) pair.
type pairAct uint8

const (
	actNone       pairAct = iota // no filter can hold the key: nothing
	actProbe                     // no filter to ask: probe
	actTestOpen                  // ask the current slice's open filter
	actTestSealed                // ask the slice's sealed filter
	actHit        pairAct = 8    // or'ed in: the filter answered maybe
)

// filterTest is one test of a key against a filter.
type filterTest struct {
	pair, key, filter int32 // index in the plan's pairs, in uniq, in the filters
}

// testAll runs tests (keys against filters) and returns the pairs of those
// the filters answered with "maybe": the same answers as TestLocations,
// but breadth-first, one hash location of every pending test after
// another. The filters of a large window do not fit in the CPU's caches,
// so nearly every bit read is a miss to memory; asked one after the other,
// a key's tests each wait for their misses in turn (a negative reads about
// two bits, a positive all k), while the reads of one round are
// independent of each other and overlap.
func (s *Strategy) testAll(keys []dedupe.Key, uniq []int, filters []*bloom.BloomFilter, tests []filterTest) []int32 {
	if len(tests) == 0 {
		return nil
	}
	k := int(s.k)
	type bits struct {
		words  []uint64
		m      uint64
		direct bool // not of this strategy's shape: asked through TestLocations
	}
	fb := make([]bits, len(filters))
	for n, f := range filters {
		words, m := f.BitSet().Words(), uint64(f.Cap())
		fb[n] = bits{words: words, m: m,
			direct: f.K() != s.k || uint64(len(words))*64 < m || uint64(f.BitSet().Len()) < m}
	}
	locs := make([]uint64, len(uniq)*k)
	hashed := make([]bool, len(uniq))
	alive := make([]int32, 0, len(tests))
	var hits []int32
	for n, t := range tests {
		loc := locs[int(t.key)*k : int(t.key+1)*k]
		if !hashed[t.key] {
			hashed[t.key] = true
			copy(loc, bloom.Locations([]byte(keys[uniq[t.key]].ID), s.k))
		}
		if fb[t.filter].direct {
			if filters[t.filter].TestLocations(loc) {
				hits = append(hits, t.pair)
			}
			continue
		}
		alive = append(alive, int32(n))
	}
	for i := 0; i < k && len(alive) > 0; i++ {
		next := 0
		for _, n := range alive {
			t := &tests[n]
			b := &fb[t.filter]
			pos := locs[int(t.key)*k+i] % b.m
			alive[next] = n
			next += int(b.words[pos>>6] >> (pos & 63) & 1)
		}
		alive = alive[:next]
	}
	for _, n := range alive {
		hits = append(hits, tests[n].pair)
	}
	return hits
}

// claimResult is what one execution of claimSQL reported.
type claimResult struct {
	ran, rc   bool
	now       time.Time
	barrier   int64 // the latest barrier's clock, in µs
	marks     map[scopeID]*marker
	unseen    map[scopeID]bool // keys whose marker readHeld must read
	confirmed int64            // positives whose marker the probe found
	held      int64            // keys whose marker the target slice already held
}

// readClaim reads the rows of claimSQL run with plan p, and learns the
// database clock from them.
func (s *Strategy) readClaim(rows pgx.Rows, err error, p *claimPlan, in insertArgs) (claimResult, error) {
	if err != nil {
		return claimResult{}, s.claimErr(err, p.target)
	}
	defer rows.Close()
	res := claimResult{marks: map[scopeID]*marker{}, unseen: map[scopeID]bool{}}
	clock := false
	var inserted int64
	for rows.Next() {
		r, err := scanClaimRow(rows)
		if err != nil {
			return claimResult{}, fmt.Errorf("bloom: claim: %w", err)
		}
		switch r.kind {
		case rowClock:
			clock = true
			res.now, res.rc, res.ran, res.barrier = *r.now, *r.rc, *r.run, *r.barrier
			if r.inserted != nil {
				inserted = *r.inserted
			}
		case rowUnseen:
			res.unseen[scopeID{*r.scope, *r.id}] = true
			continue
		case rowFound, rowHeld:
			u := scopeID{*r.scope, *r.id}
			if r.kind == rowHeld {
				res.held++
			} else if p.positive[pairKey{u.scope, u.id, r.slice.Unix()}] {
				res.confirmed++
			}
			if _, ok := res.marks[u]; !ok {
				res.marks[u] = &marker{found: true, fingerprint: r.fp}
			}
		}
	}
	if err := rows.Err(); err != nil {
		return claimResult{}, s.claimErr(err, p.target)
	}
	if !clock {
		return claimResult{}, errors.New("bloom: claim: the claim statement returned no clock")
	}
	if res.ran {
		// The keys it reported nothing about are the ones it inserted.
		n := int64(0)
		for j := range in.scope {
			u := scopeID{in.scope[j], in.id[j]}
			if _, ok := res.marks[u]; ok || res.unseen[u] {
				continue
			}
			res.marks[u] = &marker{inserted: true}
			n++
		}
		if n != inserted {
			return claimResult{}, fmt.Errorf("bloom: claim: the statement inserted %d markers, but %d keys are unaccounted for", inserted, n)
		}
	}
	s.learnClock(res.now)
	s.noteBarrier(res.barrier)
	return res, nil
}

// readHeld reads the markers of the keys the claim neither found nor
// inserted: their insert conflicted in the target slice with a marker the
// claim statement's snapshot did not see, written earlier in this
// transaction or committed by a concurrent claim that the insert waited
// for. A new statement has a new snapshot that sees them.
func (s *Strategy) readHeld(ctx context.Context, tx pgx.Tx, keys []dedupe.Key, uniq []int, p *claimPlan, res *claimResult) error {
	var scopes, ids []string
	for _, i := range uniq {
		k := keys[i]
		if _, ok := res.marks[scopeID{k.Scope, k.ID}]; !ok {
			scopes, ids = append(scopes, k.Scope), append(ids, k.ID)
		}
	}
	if len(scopes) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, s.readHeldSQL, scopes, ids, p.target)
	if err != nil {
		return fmt.Errorf("bloom: claim: reading conflicting markers: %w", err)
	}
	var scope, id string
	var fp []byte
	_, err = pgx.ForEachRow(rows, []any{&scope, &id, &fp}, func() error {
		res.marks[scopeID{scope, id}] = &marker{found: true, fingerprint: slices.Clone(fp)}
		res.held++
		return nil
	})
	if err != nil {
		return fmt.Errorf("bloom: claim: reading conflicting markers: %w", err)
	}
	return nil
}

// noteBarrier records a barrier's clock (µs) if it is the latest this
// process has seen.
func (s *Strategy) noteBarrier(us int64) {
	for {
		cur := s.barrierAt.Load()
		if us <= cur || s.barrierAt.CompareAndSwap(cur, us) {
			return
		}
	}
}

// clockEstimate is this process's estimate of the database clock.
func (s *Strategy) clockEstimate() time.Time {
	return time.Now().Add(time.Duration(s.clockOffset.Load()))
}

// learnClock records how far the database clock, read just now, is from
// the local one. The estimate only picks the slice a claim plans for; a
// wrong one costs a second round trip, never a wrong verdict.
func (s *Strategy) learnClock(db time.Time) {
	s.clockOffset.Store(int64(time.Until(db)))
}

// isolationOf names tx's isolation level for an error message.
func isolationOf(ctx context.Context, tx pgx.Tx) string {
	var iso string
	if err := tx.QueryRow(ctx, `SELECT current_setting('transaction_isolation')`).Scan(&iso); err != nil {
		return "not read committed"
	}
	return iso
}

func filterOf(sf *sliceFilter, scope string, disabled bool) *bloom.BloomFilter {
	if disabled || sf == nil {
		return nil
	}
	return sf.byScope[scope]
}

// gateErr is the error of a claim's first statement, which also reports
// the claim statement's failure to prepare (pgx prepares a batch first).
func (s *Strategy) gateErr(err error, target time.Time) error {
	if cerr := s.claimErr(err, target); errors.Is(cerr, ErrNoPartition) {
		return cerr
	}
	return fmt.Errorf("bloom: claim: taking the gate: %w", err)
}

func (s *Strategy) claimErr(err error, target time.Time) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "23514" || pe.Code == "42P01" && strings.Contains(pe.Message, s.partitionName(target))) {
		return fmt.Errorf("%w: slice %s: %v", ErrNoPartition, target.Format(time.RFC3339), err)
	}
	return fmt.Errorf("bloom: claim: %w", err)
}

// Committed adds the keys that committed as new to this process's filter of
// the slice their claim wrote them to: the one that claim recorded, since
// the claims of several lanes can straddle a slice boundary. Adding them
// only after the commit means a rolled-back claim never leaves a key in a
// filter that the store would then fail to confirm. (Adding on claim would
// be just as safe, since a positive only costs a probe.)
func (s *Strategy) Committed(keys []dedupe.Key, verdicts []dedupe.Verdict) {
	if s.cfg.DisableFilter {
		return
	}
	bySlice := map[int64][]dedupe.Key{}
	s.written.mu.Lock()
	for i, k := range keys {
		if i >= len(verdicts) || verdicts[i] != dedupe.VerdictNew {
			continue
		}
		u := scopeID{k.Scope, k.ID}
		if t, ok := s.written.slice[u]; ok {
			delete(s.written.slice, u)
			ks := bySlice[t]
			if ks == nil {
				ks = make([]dedupe.Key, 0, len(keys)-i)
			}
			bySlice[t] = append(ks, k)
		}
	}
	s.written.mu.Unlock()
	if len(bySlice) == 0 {
		return
	}
	s.filters.mu.Lock()
	defer s.filters.mu.Unlock()
	for t, ks := range bySlice {
		sf := s.filters.slices[t]
		if sf == nil {
			sf = &sliceFilter{start: time.Unix(t, 0).UTC(), byScope: map[string]*bloom.BloomFilter{}}
			s.filters.slices[t] = sf
		}
		if sf.sealed {
			continue // built from the store, which holds these keys already
		}
		for _, k := range ks {
			f := sf.byScope[k.Scope]
			if f == nil {
				f = newFilter(s.cfg.ExpectedKeysPerSlice, s.cfg.FalsePositiveRate, s.k)
				sf.byScope[k.Scope] = f
			}
			f.AddString(k.ID)
		}
	}
}
