package effprom

import (
	"errors"
	"fmt"
	"sync"

	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/highwater"
	prom "github.com/prometheus/client_golang/prometheus"
)

// metricDesc is one strategy metric: its description and how to read it.
type metricDesc[S any] struct {
	desc  *prom.Desc
	kind  prom.ValueType
	value func(S) float64
}

// strategyMetrics reads the watched strategies' Stats at each scrape.
type strategyMetrics struct {
	highwater []metricDesc[highwater.Stats]
	bloom     []metricDesc[bloom.Stats]

	mu  sync.Mutex
	hws map[string]*highwater.Strategy
	bls map[string]*bloom.Strategy
}

func newStrategyMetrics(ns string, cl prom.Labels) strategyMetrics {
	hw := func(name, help string, kind prom.ValueType, value func(highwater.Stats) float64) metricDesc[highwater.Stats] {
		return metricDesc[highwater.Stats]{prom.NewDesc(prom.BuildFQName(ns, "highwater", name), help, []string{labelConsumer}, cl), kind, value}
	}
	bl := func(name, help string, kind prom.ValueType, value func(bloom.Stats) float64) metricDesc[bloom.Stats] {
		return metricDesc[bloom.Stats]{prom.NewDesc(prom.BuildFQName(ns, "bloom", name), help, []string{labelConsumer}, cl), kind, value}
	}
	c, g := prom.CounterValue, prom.GaugeValue
	return strategyMetrics{
		highwater: []metricDesc[highwater.Stats]{
			hw("cache_hits_total", "Keys the marks cache answered without a database round trip.", c, func(s highwater.Stats) float64 { return float64(s.CacheHits) }),
			hw("cache_misses_total", "Keys that needed the database.", c, func(s highwater.Stats) float64 { return float64(s.CacheMisses) }),
			hw("cache_evictions_total", "Senders dropped from the full marks cache.", c, func(s highwater.Stats) float64 { return float64(s.CacheEvictions) }),
			hw("cache_entries", "Senders in the marks cache.", g, func(s highwater.Stats) float64 { return float64(s.CacheEntries) }),
			hw("gaps_total", "Keys whose sequence number was ahead of their sender's mark.", c, func(s highwater.Stats) float64 { return float64(s.Gaps) }),
			hw("far_gaps_total", "Gaps further ahead than the reorder window.", c, func(s highwater.Stats) float64 { return float64(s.FarGaps) }),
			hw("stuck_senders", "Senders held back behind a missing sequence number.", g, func(s highwater.Stats) float64 { return float64(s.StuckSenders) }),
		},
		bloom: []metricDesc[bloom.Stats]{
			bl("keys_total", "Keys claimed.", c, func(s bloom.Stats) float64 { return float64(s.Keys) }),
			bl("new_keys_total", "Claimed keys that were new.", c, func(s bloom.Stats) float64 { return float64(s.New) }),
			bl("filter_bytes", "Memory held by the filters' bit arrays.", g, func(s bloom.Stats) float64 { return float64(s.FilterBytes) }),
			bl("filter_slices", "Time slices with a filter.", g, func(s bloom.Stats) float64 { return float64(s.Slices) }),
			bl("sealed_slices_total", "Slice filters rebuilt from the store.", c, func(s bloom.Stats) float64 { return float64(s.Sealed) }),
			bl("filter_tests_total", "Checks of a key against a sealed filter.", c, func(s bloom.Stats) float64 { return float64(s.Tests) }),
			bl("filter_positives_total", "Checks a sealed filter answered with maybe.", c, func(s bloom.Stats) float64 { return float64(s.Positives) }),
			bl("false_positives_total", "Positives whose marker the probe did not find.", c, func(s bloom.Stats) float64 { return float64(s.FalsePositives) }),
			bl("false_positive_ratio", "Measured false-positive rate: false positives over the checks of keys the filter did not hold.", g, func(s bloom.Stats) float64 { return s.FalsePositiveRate }),
			bl("probes_total", "Lookups of a key in a partition.", c, func(s bloom.Stats) float64 { return float64(s.Probes) }),
			bl("probes_saved_total", "Lookups a negative from a sealed filter made unnecessary.", c, func(s bloom.Stats) float64 { return float64(s.ProbesSaved) }),
			bl("conflicts_total", "Keys another consumer had written to the current slice.", c, func(s bloom.Stats) float64 { return float64(s.Conflicts) }),
			bl("dropped_partitions_total", "Expired partitions this process dropped.", c, func(s bloom.Stats) float64 { return float64(s.Dropped) }),
			bl("warm", "1 when the filters of all closed live slices are built, else 0.", g, func(s bloom.Stats) float64 {
				if s.Warm {
					return 1
				}
				return 0
			}),
		},
		hws: map[string]*highwater.Strategy{},
		bls: map[string]*bloom.Strategy{},
	}
}

// ErrAlreadyWatched is returned by WatchHighwater and WatchBloom for a
// consumer name that already has a watched strategy of that kind.
var ErrAlreadyWatched = errors.New("effprom: a strategy of this kind is already watched for this consumer")

// WatchHighwater exports s's Stats at each scrape, labelled
// consumer=consumerName:
//
//	effectively_highwater_cache_hits_total, _cache_misses_total,
//	_cache_evictions_total, _cache_entries, _gaps_total, _far_gaps_total,
//	_stuck_senders
func (m *Metrics) WatchHighwater(consumerName string, s *highwater.Strategy) error {
	if s == nil {
		return errors.New("effprom: WatchHighwater: nil strategy")
	}
	return watch(&m.strategies.mu, m.strategies.hws, consumerName, s)
}

// WatchBloom exports s's Stats at each scrape, labelled
// consumer=consumerName:
//
//	effectively_bloom_keys_total, _new_keys_total, _filter_bytes,
//	_filter_slices, _sealed_slices_total, _filter_tests_total,
//	_filter_positives_total, _false_positives_total,
//	_false_positive_ratio (measured), _probes_total, _probes_saved_total,
//	_conflicts_total, _dropped_partitions_total, _warm
func (m *Metrics) WatchBloom(consumerName string, s *bloom.Strategy) error {
	if s == nil {
		return errors.New("effprom: WatchBloom: nil strategy")
	}
	return watch(&m.strategies.mu, m.strategies.bls, consumerName, s)
}

// Unwatch stops exporting the strategies watched for consumerName.
func (m *Metrics) Unwatch(consumerName string) {
	m.strategies.mu.Lock()
	defer m.strategies.mu.Unlock()
	delete(m.strategies.hws, consumerName)
	delete(m.strategies.bls, consumerName)
}

func watch[S any](mu *sync.Mutex, watched map[string]S, name string, s S) error {
	mu.Lock()
	defer mu.Unlock()
	if _, ok := watched[name]; ok {
		return fmt.Errorf("%w: %q", ErrAlreadyWatched, name)
	}
	watched[name] = s
	return nil
}

func (sm *strategyMetrics) describe(ch chan<- *prom.Desc) {
	for _, d := range sm.highwater {
		ch <- d.desc
	}
	for _, d := range sm.bloom {
		ch <- d.desc
	}
}

func (sm *strategyMetrics) collect(ch chan<- prom.Metric) {
	sm.mu.Lock()
	hws := make(map[string]highwater.Stats, len(sm.hws))
	for name, s := range sm.hws {
		hws[name] = s.Stats()
	}
	bls := make(map[string]bloom.Stats, len(sm.bls))
	for name, s := range sm.bls {
		bls[name] = s.Stats()
	}
	sm.mu.Unlock()
	emit(ch, sm.highwater, hws)
	emit(ch, sm.bloom, bls)
}

func emit[S any](ch chan<- prom.Metric, descs []metricDesc[S], stats map[string]S) {
	for name, st := range stats {
		for _, d := range descs {
			ch <- prom.MustNewConstMetric(d.desc, d.kind, d.value(st), name)
		}
	}
}
