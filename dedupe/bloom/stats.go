package bloom

import "sync/atomic"

// Stats are a Strategy's counters since New, and the size of its filters.
type Stats struct {
	// Keys is the number of keys claimed; New the number that were new.
	Keys, New int64
	// FilterBytes is the memory held by the filters' bit arrays.
	FilterBytes int64
	// SealedBytes and SealedKeys are the memory of the sealed filters and
	// the number of markers they hold (SealedBytes/SealedKeys is the filter
	// memory per key).
	SealedBytes, SealedKeys int64
	// Slices is the number of slices with filters; Sealed counts those
	// rebuilt from the store since New.
	Slices, Sealed int64
	// Tests counts checks of a key against a sealed filter (the filters
	// whose negatives save probes); Positives those that said "maybe".
	// Checks against this process's open filter of the current slice, a
	// hint that only saves the read of a conflict, are not counted.
	Tests, Positives int64
	// ConfirmedPositives are positives whose marker the probe found in that
	// slice; FalsePositives = Positives - ConfirmedPositives.
	ConfirmedPositives, FalsePositives int64
	// FalsePositiveRate is the measured rate: FalsePositives over the
	// checks of keys the filter did not hold (Tests - ConfirmedPositives).
	FalsePositiveRate float64
	// Probes counts (key, partition) lookups made; ProbesSaved those a
	// negative from a sealed filter made unnecessary (slices without a
	// marker of the key's scope are not counted).
	Probes, ProbesSaved int64
	// Conflicts counts keys that another consumer had written to the
	// current slice, read after the insert skipped them.
	Conflicts int64
	// Dropped counts partitions this process dropped.
	Dropped int64
	// Warm reports whether Warm (or Maintain) has built the filters of all
	// closed live slices.
	Warm bool
}

type counters struct {
	keys, fresh, tests, positives, confirmed, probes, saved, conflicts atomic.Int64
	sealed, dropped                                                    atomic.Int64
}

// claimStats are one claim's counts, added at once.
type claimStats struct {
	keys, fresh, tests, positives, confirmed, probes, saved, conflicts int64
}

func (c *counters) add(s claimStats) {
	c.keys.Add(s.keys)
	c.fresh.Add(s.fresh)
	c.tests.Add(s.tests)
	c.positives.Add(s.positives)
	c.confirmed.Add(s.confirmed)
	c.probes.Add(s.probes)
	c.saved.Add(s.saved)
	c.conflicts.Add(s.conflicts)
}

// Stats returns the strategy's counters and filter sizes.
func (s *Strategy) Stats() Stats {
	st := Stats{
		Keys:               s.stats.keys.Load(),
		New:                s.stats.fresh.Load(),
		Tests:              s.stats.tests.Load(),
		Positives:          s.stats.positives.Load(),
		ConfirmedPositives: s.stats.confirmed.Load(),
		Probes:             s.stats.probes.Load(),
		ProbesSaved:        s.stats.saved.Load(),
		Conflicts:          s.stats.conflicts.Load(),
		Sealed:             s.stats.sealed.Load(),
		Dropped:            s.stats.dropped.Load(),
		Warm:               s.warm.Load(),
	}
	st.FalsePositives = st.Positives - st.ConfirmedPositives
	if d := st.Tests - st.ConfirmedPositives; d > 0 {
		st.FalsePositiveRate = float64(st.FalsePositives) / float64(d)
	}
	s.filters.mu.RLock()
	for _, sf := range s.filters.slices {
		st.Slices++
		b := int64(sf.bytes())
		st.FilterBytes += b
		if sf.sealed {
			st.SealedBytes += b
			st.SealedKeys += sf.keys
		}
	}
	s.filters.mu.RUnlock()
	return st
}
