package bloom

import (
	"sync"
	"sync/atomic"
)

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

// counters are the claims' counts, added and read under one lock so that
// a snapshot never holds half of a claim (positives counted, their
// confirmations not yet), and the seal and drop counts.
type counters struct {
	mu              sync.Mutex
	claims          claimStats
	sealed, dropped atomic.Int64
}

// claimStats are one claim's counts, added at once.
type claimStats struct {
	keys, fresh, tests, positives, confirmed, probes, saved, conflicts int64
}

func (c *counters) add(s claimStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &c.claims
	t.keys += s.keys
	t.fresh += s.fresh
	t.tests += s.tests
	t.positives += s.positives
	t.confirmed += s.confirmed
	t.probes += s.probes
	t.saved += s.saved
	t.conflicts += s.conflicts
}

func (c *counters) snapshot() claimStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.claims
}

// Stats returns the strategy's counters and filter sizes.
func (s *Strategy) Stats() Stats {
	c := s.stats.snapshot()
	st := Stats{
		Keys:               c.keys,
		New:                c.fresh,
		Tests:              c.tests,
		Positives:          c.positives,
		ConfirmedPositives: c.confirmed,
		Probes:             c.probes,
		ProbesSaved:        c.saved,
		Conflicts:          c.conflicts,
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
