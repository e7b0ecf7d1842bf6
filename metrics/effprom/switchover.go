package effprom

import (
	"errors"
	"fmt"
	"sync"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/switchover"
	prom "github.com/prometheus/client_golang/prometheus"
)

// The labels of shadow_verdicts_total besides consumer.
const (
	labelLive   = "live"
	labelShadow = "shadow"
)

// verdictNames are the label values of the verdicts a shadow compares.
var verdictNames = []dedupe.Verdict{dedupe.VerdictNew, dedupe.VerdictDuplicate, dedupe.VerdictGap, dedupe.VerdictMismatch}

// SwitchoverMetrics exports, at each scrape, the Stats of the
// dedupe/switchover wrappers it watches: a Shadow trying a strategy beside
// the live one, and a Migration from one strategy to another. It is a
// prometheus.Collector, to register. It is safe for concurrent use.
type SwitchoverMetrics struct {
	shadow    []metricDesc[switchover.ShadowStats]
	verdicts  *prom.Desc
	migration []metricDesc[migrationState]

	mu         sync.Mutex
	shadows    map[string]*switchover.Shadow
	migrations map[string]*switchover.Migration
}

// migrationState is what a scrape reads of a Migration.
type migrationState struct {
	switchover.Stats
	switchover.Status
}

var _ prom.Collector = (*SwitchoverMetrics)(nil)

// NewSwitchover returns SwitchoverMetrics with the namespace and constant
// labels of opts (its buckets are not used). Register it with a
// prometheus.Registerer to export it.
func NewSwitchover(opts Options) (*SwitchoverMetrics, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	for _, name := range []string{labelLive, labelShadow} {
		if _, ok := opts.ConstLabels[name]; ok {
			return nil, &OptionsError{Field: "ConstLabels", Reason: fmt.Sprintf("label %q is set by the package itself", name)}
		}
	}
	ns, cl := opts.Namespace, prom.Labels(opts.ConstLabels)
	c, g := prom.CounterValue, prom.GaugeValue
	sh := func(name, help string, value func(switchover.ShadowStats) float64) metricDesc[switchover.ShadowStats] {
		return metricDesc[switchover.ShadowStats]{prom.NewDesc(prom.BuildFQName(ns, "shadow", name), help, []string{labelConsumer}, cl), c, value}
	}
	mg := func(name, help string, kind prom.ValueType, value func(migrationState) float64) metricDesc[migrationState] {
		return metricDesc[migrationState]{prom.NewDesc(prom.BuildFQName(ns, "switchover", name), help, []string{labelConsumer}, cl), kind, value}
	}
	return &SwitchoverMetrics{
		shadow: []metricDesc[switchover.ShadowStats]{
			sh("keys_total", "Keys the live strategy claimed while a shadow strategy ran beside it.", func(s switchover.ShadowStats) float64 { return float64(s.Keys) }),
			sh("compared_total", "Keys both the live and the shadow strategy gave a verdict for.", func(s switchover.ShadowStats) float64 { return float64(s.Compared) }),
			sh("disagreements_total", "Compared keys whose shadow verdict differs from the live one (the live one decided).", func(s switchover.ShadowStats) float64 { return float64(s.Disagreements) }),
			sh("refused_total", "Keys the shadow strategy's CheckKey refused: not claimed by it.", func(s switchover.ShadowStats) float64 { return float64(s.Refused) }),
			sh("errors_total", "Shadow claims that failed; their savepoints were rolled back and the live verdicts stood.", func(s switchover.ShadowStats) float64 { return float64(s.Errors) }),
		},
		verdicts: prom.NewDesc(prom.BuildFQName(ns, "shadow", "verdicts_total"),
			"Compared keys by the live and the shadow strategy's verdicts (new, duplicate, gap, mismatch). live=duplicate,shadow=new: the shadow would have applied the message again; live=new,shadow=duplicate: it would have dropped it.",
			[]string{labelConsumer, labelLive, labelShadow}, cl),
		migration: []metricDesc[migrationState]{
			mg("keys_total", "Keys claimed through a Migration.", c, func(s migrationState) float64 { return float64(s.Keys) }),
			mg("lookups_total", "Keys looked up in the old strategy's store.", c, func(s migrationState) float64 { return float64(s.Lookups) }),
			mg("known_to_old_total", "Keys the old strategy's store knew: duplicates or mismatches the new strategy alone would not have caught.", c, func(s migrationState) float64 { return float64(s.KnownToOld) }),
			mg("consulting", "1 while the old strategy's store is consulted, 0 once it can be dropped.", g, func(s migrationState) float64 {
				if s.Consulting {
					return 1
				}
				return 0
			}),
			mg("until_timestamp_seconds", "When the old strategy's store stops being consulted (Unix time).", g, func(s migrationState) float64 {
				return float64(s.Until.UnixNano()) / 1e9
			}),
		},
		shadows:    map[string]*switchover.Shadow{},
		migrations: map[string]*switchover.Migration{},
	}, nil
}

// WatchShadow exports s's Stats at each scrape, labelled
// consumer=consumerName:
//
//	effectively_shadow_keys_total, _compared_total, _disagreements_total,
//	_refused_total, _errors_total, and _verdicts_total{live, shadow}
func (m *SwitchoverMetrics) WatchShadow(consumerName string, s *switchover.Shadow) error {
	if s == nil {
		return errors.New("effprom: WatchShadow: nil shadow")
	}
	return watch(&m.mu, m.shadows, consumerName, s)
}

// WatchMigration exports s's Stats and Status at each scrape, labelled
// consumer=consumerName:
//
//	effectively_switchover_keys_total, _lookups_total,
//	_known_to_old_total, _consulting, _until_timestamp_seconds
func (m *SwitchoverMetrics) WatchMigration(consumerName string, s *switchover.Migration) error {
	if s == nil {
		return errors.New("effprom: WatchMigration: nil migration")
	}
	return watch(&m.mu, m.migrations, consumerName, s)
}

// Unwatch stops exporting the wrappers watched for consumerName.
func (m *SwitchoverMetrics) Unwatch(consumerName string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.shadows, consumerName)
	delete(m.migrations, consumerName)
}

// Describe implements prometheus.Collector.
func (m *SwitchoverMetrics) Describe(ch chan<- *prom.Desc) {
	for _, d := range m.shadow {
		ch <- d.desc
	}
	ch <- m.verdicts
	for _, d := range m.migration {
		ch <- d.desc
	}
}

// Collect implements prometheus.Collector.
func (m *SwitchoverMetrics) Collect(ch chan<- prom.Metric) {
	m.mu.Lock()
	shs := make(map[string]switchover.ShadowStats, len(m.shadows))
	for name, s := range m.shadows {
		shs[name] = s.Stats()
	}
	mgs := make(map[string]migrationState, len(m.migrations))
	for name, s := range m.migrations {
		mgs[name] = migrationState{s.Stats(), s.Status()}
	}
	m.mu.Unlock()
	emit(ch, m.shadow, shs)
	emit(ch, m.migration, mgs)
	for name, st := range shs {
		for _, l := range verdictNames {
			for _, s := range verdictNames {
				ch <- prom.MustNewConstMetric(m.verdicts, prom.CounterValue, float64(st.Pairs[l][s]), name, l.String(), s.String())
			}
		}
	}
}
