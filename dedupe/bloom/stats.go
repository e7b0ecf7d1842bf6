package bloom

import (
	"sync"
	"sync/atomic"

	"github.com/effectively-once/effectively/dedupe"
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

var _ dedupe.StatsReporter = (*Strategy)(nil)

// ReportStats implements dedupe.StatsReporter: Stats as named counters and
// gauges (keys_total, new_keys_total, filter_bytes, filter_slices,
// sealed_slices_total, filter_tests_total, filter_positives_total,
// false_positives_total, false_positive_ratio, probes_total,
// probes_saved_total, conflicts_total, dropped_partitions_total, and warm:
// 1 or 0).
func (s *Strategy) ReportStats() []dedupe.Stat {
	st := s.Stats()
	warm := 0.0
	if st.Warm {
		warm = 1
	}
	c, g := dedupe.StatCounter, dedupe.StatGauge
	return []dedupe.Stat{
		{Name: "keys_total", Help: "Keys claimed.", Kind: c, Value: float64(st.Keys)},
		{Name: "new_keys_total", Help: "Claimed keys that were new.", Kind: c, Value: float64(st.New)},
		{Name: "filter_bytes", Help: "Memory held by the filters' bit arrays.", Kind: g, Value: float64(st.FilterBytes)},
		{Name: "filter_slices", Help: "Time slices with a filter.", Kind: g, Value: float64(st.Slices)},
		{Name: "sealed_slices_total", Help: "Slice filters rebuilt from the store.", Kind: c, Value: float64(st.Sealed)},
		{Name: "filter_tests_total", Help: "Checks of a key against a sealed filter.", Kind: c, Value: float64(st.Tests)},
		{Name: "filter_positives_total", Help: "Checks a sealed filter answered with maybe.", Kind: c, Value: float64(st.Positives)},
		{Name: "false_positives_total", Help: "Positives whose marker the probe did not find.", Kind: c, Value: float64(st.FalsePositives)},
		{Name: "false_positive_ratio", Help: "Measured false-positive rate: false positives over the checks of keys the filter did not hold.", Kind: g, Value: st.FalsePositiveRate},
		{Name: "probes_total", Help: "Lookups of a key in a partition.", Kind: c, Value: float64(st.Probes)},
		{Name: "probes_saved_total", Help: "Lookups a negative from a sealed filter made unnecessary.", Kind: c, Value: float64(st.ProbesSaved)},
		{Name: "conflicts_total", Help: "Keys another consumer had written to the current slice.", Kind: c, Value: float64(st.Conflicts)},
		{Name: "dropped_partitions_total", Help: "Expired partitions this process dropped.", Kind: c, Value: float64(st.Dropped)},
		{Name: "warm", Help: "1 when the filters of all closed live slices are built, else 0.", Kind: g, Value: warm},
	}
}
