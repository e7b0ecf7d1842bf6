package highwater

import "github.com/effectively-once/effectively/dedupe"

var _ dedupe.StatsReporter = (*Strategy)(nil)

// ReportStats implements dedupe.StatsReporter: Stats as named counters and
// gauges (cache_hits_total, cache_misses_total, cache_evictions_total,
// cache_entries, gaps_total, far_gaps_total, stuck_senders).
func (s *Strategy) ReportStats() []dedupe.Stat {
	st := s.Stats()
	c, g := dedupe.StatCounter, dedupe.StatGauge
	return []dedupe.Stat{
		{Name: "cache_hits_total", Help: "Keys the marks cache answered without a database round trip.", Kind: c, Value: float64(st.CacheHits)},
		{Name: "cache_misses_total", Help: "Keys that needed the database.", Kind: c, Value: float64(st.CacheMisses)},
		{Name: "cache_evictions_total", Help: "Senders dropped from the full marks cache.", Kind: c, Value: float64(st.CacheEvictions)},
		{Name: "cache_entries", Help: "Senders in the marks cache.", Kind: g, Value: float64(st.CacheEntries)},
		{Name: "gaps_total", Help: "Keys whose sequence number was ahead of their sender's mark.", Kind: c, Value: float64(st.Gaps)},
		{Name: "far_gaps_total", Help: "Gaps further ahead than the reorder window.", Kind: c, Value: float64(st.FarGaps)},
		{Name: "stuck_senders", Help: "Senders held back behind a missing sequence number.", Kind: g, Value: float64(st.StuckSenders)},
	}
}
