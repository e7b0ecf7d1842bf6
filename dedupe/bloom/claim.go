package bloom

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/effectively-once/effectively/dedupe"
)

func (s *Strategy) buildSQL() {
	// One statement probes the (key, slice) pairs the filters could not
	// rule out and inserts the keys it did not find into the current slice.
	// A key that conflicts there (another consumer wrote it to the current
	// slice, which no filter of ours can know) is neither found nor
	// inserted; conflictSQL then reads its marker.
	s.claimSQL = `WITH probe AS (
    SELECT p.scope, p.id, p.slice, m.fingerprint
    FROM unnest($1::text[], $2::text[], $3::timestamptz[]) AS p(scope, id, slice)
    CROSS JOIN LATERAL (
        SELECT m.fingerprint FROM ` + s.parent + ` AS m
        WHERE m.scope = p.scope AND m.id = p.id AND m.slice = p.slice
        LIMIT 1
    ) AS m
), ins AS (
    INSERT INTO ` + s.parent + ` (scope, id, slice, fingerprint)
    SELECT k.scope, k.id, $7::timestamptz, k.fingerprint
    FROM unnest($4::text[], $5::text[], $6::bytea[]) AS k(scope, id, fingerprint)
    WHERE NOT EXISTS (SELECT 1 FROM probe WHERE probe.scope = k.scope AND probe.id = k.id)
    ON CONFLICT DO NOTHING
    RETURNING scope, id
)
SELECT false, scope, id, slice, fingerprint FROM probe
UNION ALL
SELECT true, scope, id, NULL, NULL FROM ins`
	s.conflictSQL = `SELECT p.scope, p.id, m.fingerprint
FROM unnest($1::text[], $2::text[]) AS p(scope, id)
CROSS JOIN LATERAL (
    SELECT m.fingerprint FROM ` + s.parent + ` AS m
    WHERE m.scope = p.scope AND m.id = p.id AND m.slice = $3::timestamptz
    LIMIT 1
) AS m`
}

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

// Claim decides the verdicts of keys and writes the markers of new keys in
// tx, with four statements in two round trips whatever the batch size (a
// fifth, rare one reads the markers of keys another consumer wrote to the
// current slice): see the package documentation for the protocol. tx must
// be READ COMMITTED. An invalid key (see dedupe.Validate; ID is required)
// fails the whole claim with a *dedupe.KeyError naming it.
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

	// Distinct keys, first occurrence first, and their lock keys.
	first := make(map[scopeID]int, len(keys))
	uniq := make([]int, 0, len(keys))
	locks := make([]int64, 0, len(keys))
	for i, k := range keys {
		u := scopeID{k.Scope, k.ID}
		if _, ok := first[u]; ok {
			continue
		}
		first[u] = i
		uniq = append(uniq, i)
		locks = append(locks, s.keyHash(k.Scope, k.ID))
	}
	slices.Sort(locks) // a fixed order: two batches never deadlock on their keys
	locks = slices.Compact(locks)

	// Round trip 1: the shared gate (a seal waits for it), the key locks
	// (a concurrent claimer of one of these keys finishes first), and then
	// the database clock, which picks the slice this claim writes to.
	var (
		iso   string
		clock time.Time
	)
	b := &pgx.Batch{}
	b.Queue(`SELECT pg_advisory_xact_lock_shared($1)`, s.gateKey)
	b.Queue(`SELECT pg_advisory_xact_lock(h) FROM unnest($1::bigint[]) AS h`, locks)
	b.Queue(`SELECT current_setting('transaction_isolation'), clock_timestamp()`).QueryRow(func(row pgx.Row) error {
		return row.Scan(&iso, &clock)
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("bloom: claim: locking keys: %w", err)
	}
	if iso != "read committed" {
		return nil, fmt.Errorf("%w (the transaction is %s)", ErrIsolation, iso)
	}
	target := s.sliceOf(clock)

	// Which (key, slice) pairs need a probe.
	var (
		pScope, pID []string
		pSlice      []time.Time
		positive    = map[pairKey]bool{} // pairs probed because a sealed filter said "maybe"
		st          claimStats
	)
	from := s.liveFrom(clock)
	s.filters.mu.RLock()
	window := s.filters.window(from, target, s.cfg.Slice)
	for _, i := range uniq {
		k := keys[i]
		var locs []uint64
		for j, sf := range window {
			t := from.Add(time.Duration(j) * s.cfg.Slice)
			isTarget := j == len(window)-1
			if s.cfg.DisableFilter || sf == nil || !sf.sealed {
				if isTarget {
					// The insert finds the current slice's markers by its
					// unique index; an open filter's positive saves the
					// extra read of a conflict.
					if f := filterOf(sf, k.Scope, s.cfg.DisableFilter); f != nil {
						if locs == nil {
							locs = bloom.Locations([]byte(k.ID), s.k)
						}
						if f.TestLocations(locs) {
							pScope, pID, pSlice = append(pScope, k.Scope), append(pID, k.ID), append(pSlice, t)
						}
					}
					continue
				}
				pScope, pID, pSlice = append(pScope, k.Scope), append(pID, k.ID), append(pSlice, t)
				continue
			}
			f := sf.byScope[k.Scope]
			if f != nil {
				if locs == nil {
					locs = bloom.Locations([]byte(k.ID), s.k)
				}
				st.tests++
				if f.TestLocations(locs) {
					st.positives++
					positive[pairKey{k.Scope, k.ID, t.Unix()}] = true
					pScope, pID, pSlice = append(pScope, k.Scope), append(pID, k.ID), append(pSlice, t)
					continue
				}
				st.saved++
			}
		}
	}
	s.filters.mu.RUnlock()
	st.probes = int64(len(pScope))

	// Round trip 2: probe and insert.
	iScope := make([]string, len(uniq))
	iID := make([]string, len(uniq))
	iFP := make([][]byte, len(uniq))
	for j, i := range uniq {
		iScope[j], iID[j], iFP[j] = keys[i].Scope, keys[i].ID, keys[i].Fingerprint
	}
	marks := make(map[scopeID]*marker, len(uniq))
	rows, err := tx.Query(ctx, s.claimSQL, pScope, pID, pSlice, iScope, iID, iFP, target)
	if err != nil {
		return nil, s.claimErr(err, target)
	}
	for rows.Next() {
		var (
			inserted  bool
			scope, id string
			slice     *time.Time
			fp        []byte
		)
		if err := rows.Scan(&inserted, &scope, &id, &slice, &fp); err != nil {
			rows.Close()
			return nil, fmt.Errorf("bloom: claim: %w", err)
		}
		u := scopeID{scope, id}
		if inserted {
			marks[u] = &marker{inserted: true}
			continue
		}
		if positive[pairKey{scope, id, slice.Unix()}] {
			st.confirmed++
		}
		if _, ok := marks[u]; !ok {
			marks[u] = &marker{found: true, fingerprint: fp}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, s.claimErr(err, target)
	}

	// Round trip 3, rare: keys that conflicted in the current slice.
	var cScope, cID []string
	for _, i := range uniq {
		if marks[scopeID{keys[i].Scope, keys[i].ID}] == nil {
			cScope, cID = append(cScope, keys[i].Scope), append(cID, keys[i].ID)
		}
	}
	if len(cScope) > 0 {
		st.conflicts = int64(len(cScope))
		rows, err := tx.Query(ctx, s.conflictSQL, cScope, cID, target)
		if err != nil {
			return nil, fmt.Errorf("bloom: claim: reading conflicting markers: %w", err)
		}
		for rows.Next() {
			var scope, id string
			var fp []byte
			if err := rows.Scan(&scope, &id, &fp); err != nil {
				rows.Close()
				return nil, fmt.Errorf("bloom: claim: %w", err)
			}
			marks[scopeID{scope, id}] = &marker{found: true, fingerprint: fp}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("bloom: claim: reading conflicting markers: %w", err)
		}
	}

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
		s.written.note(fresh, target.Unix())
	}
	return verdicts, nil
}

func filterOf(sf *sliceFilter, scope string, disabled bool) *bloom.BloomFilter {
	if disabled || sf == nil {
		return nil
	}
	return sf.byScope[scope]
}

func (s *Strategy) claimErr(err error, target time.Time) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23514" {
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
			bySlice[t] = append(bySlice[t], k)
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
