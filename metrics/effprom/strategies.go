package effprom

import (
	"errors"
	"fmt"
	"sync"

	"github.com/effectively-once/effectively/dedupe"
	prom "github.com/prometheus/client_golang/prometheus"
)

// metricDesc is one metric read from a stats value: its description and
// how to read it.
type metricDesc[S any] struct {
	desc  *prom.Desc
	kind  prom.ValueType
	value func(S) float64
}

// ErrAlreadyWatched is returned by the Watch methods for a consumer name
// that already has a watched strategy (or switchover wrapper) of that kind.
var ErrAlreadyWatched = errors.New("effprom: already watched for this consumer")

// StrategyMetrics exports, at each scrape, the statistics of the dedupe
// strategies it watches: those that implement dedupe.StatsReporter
// (highwater's cache and gaps, bloom's filters and probes, or a strategy of
// your own). A statistic named s of a strategy named n is the series
// <namespace>_<n>_<s>{consumer}:
//
//	effectively_highwater_cache_hits_total, _cache_misses_total,
//	_cache_evictions_total, _cache_entries, _gaps_total, _far_gaps_total,
//	_stuck_senders
//
//	effectively_bloom_keys_total, _new_keys_total, _filter_bytes,
//	_filter_slices, _sealed_slices_total, _filter_tests_total,
//	_filter_positives_total, _false_positives_total,
//	_false_positive_ratio (measured), _probes_total, _probes_saved_total,
//	_conflicts_total, _dropped_partitions_total, _warm
//
// It is a prometheus.Collector, to register beside Metrics. Which series
// it exports depends on the strategies watched, so it describes none: the
// registry treats it as an unchecked collector, and a strategy may be
// watched before or after registration. Watch checks the names instead,
// and refuses a strategy whose series would clash with another's. It is
// safe for concurrent use.
type StrategyMetrics struct {
	ns string
	cl prom.Labels

	mu      sync.Mutex
	watched map[string]*watchedStrategy // by consumer name
	descs   map[string]statDesc         // by metric name, of every strategy ever watched
}

// watchedStrategy is one consumer's strategy and its series.
type watchedStrategy struct {
	r     dedupe.StatsReporter
	name  string
	descs map[string]statDesc // by the statistic's name
}

// statDesc is the series of one statistic.
type statDesc struct {
	desc *prom.Desc
	kind dedupe.StatKind
	help string
}

var _ prom.Collector = (*StrategyMetrics)(nil)

// NewStrategies returns StrategyMetrics with the namespace and constant
// labels of opts (its buckets are not used). Register it with a
// prometheus.Registerer to export it.
func NewStrategies(opts Options) (*StrategyMetrics, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	return &StrategyMetrics{ns: opts.Namespace, cl: prom.Labels(opts.ConstLabels),
		watched: map[string]*watchedStrategy{}, descs: map[string]statDesc{}}, nil
}

// Watch exports s's statistics at each scrape, labelled
// consumer=consumerName, when s implements dedupe.StatsReporter. A
// strategy that does not (idset) has nothing to export: Watch returns nil
// and records nothing, so that a program may watch whatever strategy it
// configured. It returns an error matching ErrAlreadyWatched when
// consumerName already has a watched strategy, and another error when the
// strategy's name or report does not make valid metric names
// (dedupe.CheckStats), or when one of its series has the name of another
// strategy's with a different help text or kind.
func (m *StrategyMetrics) Watch(consumerName string, s dedupe.Strategy) error {
	if s == nil {
		return errors.New("effprom: Watch: nil strategy")
	}
	r, ok := s.(dedupe.StatsReporter)
	if !ok {
		return nil
	}
	name := s.Name()
	if !namespaceRE.MatchString(name) {
		return fmt.Errorf("effprom: Watch: strategy name %q is not a valid part of a metric name", name)
	}
	stats := r.ReportStats()
	if err := dedupe.CheckStats(stats); err != nil {
		return fmt.Errorf("effprom: Watch: strategy %s: %w", name, err)
	}
	w := &watchedStrategy{r: r, name: name, descs: make(map[string]statDesc, len(stats))}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.watched[consumerName]; ok {
		return fmt.Errorf("%w: %q", ErrAlreadyWatched, consumerName)
	}
	fresh := map[string]statDesc{}
	for _, st := range stats {
		fq := prom.BuildFQName(m.ns, name, st.Name)
		d, known := m.descs[fq]
		if !known {
			d = statDesc{desc: prom.NewDesc(fq, st.Help, []string{labelConsumer}, m.cl), kind: st.Kind, help: st.Help}
			fresh[fq] = d
		}
		if d.kind != st.Kind || d.help != st.Help {
			return fmt.Errorf("effprom: Watch: strategy %s: %s is already exported as a %s with help %q, not a %s with help %q",
				name, fq, d.kind, d.help, st.Kind, st.Help)
		}
		w.descs[st.Name] = d
	}
	for fq, d := range fresh {
		m.descs[fq] = d
	}
	m.watched[consumerName] = w
	return nil
}

// Unwatch stops exporting the strategy watched for consumerName.
func (m *StrategyMetrics) Unwatch(consumerName string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.watched, consumerName)
}

// Describe implements prometheus.Collector. It describes nothing (see
// StrategyMetrics).
func (m *StrategyMetrics) Describe(chan<- *prom.Desc) {}

// Collect implements prometheus.Collector. A statistic that was not in
// the strategy's report when it was watched, or changed its kind or help,
// is reported as a collection error, which fails the scrape.
func (m *StrategyMetrics) Collect(ch chan<- prom.Metric) {
	m.mu.Lock()
	watched := make(map[string]*watchedStrategy, len(m.watched))
	for name, w := range m.watched {
		watched[name] = w
	}
	m.mu.Unlock()
	for consumerName, w := range watched {
		for _, st := range w.r.ReportStats() {
			d, ok := w.descs[st.Name]
			if !ok || d.kind != st.Kind || d.help != st.Help {
				ch <- prom.NewInvalidMetric(prom.NewInvalidDesc(nil),
					fmt.Errorf("effprom: strategy %s of consumer %q reported %s (%s), which it did not report when it was watched", w.name, consumerName, st.Name, st.Kind))
				continue
			}
			kind := prom.GaugeValue
			if st.Kind == dedupe.StatCounter {
				kind = prom.CounterValue
			}
			ch <- prom.MustNewConstMetric(d.desc, kind, st.Value, consumerName)
		}
	}
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

func emit[S any](ch chan<- prom.Metric, descs []metricDesc[S], stats map[string]S) {
	for name, st := range stats {
		for _, d := range descs {
			ch <- prom.MustNewConstMetric(d.desc, d.kind, d.value(st), name)
		}
	}
}
