package effprom

import (
	"context"
	"fmt"
	"sync"

	"github.com/effectively-once/effectively/outbox"
	prom "github.com/prometheus/client_golang/prometheus"
)

const (
	labelSink   = "sink"
	labelKind   = "kind"
	labelChange = "change"
)

// Values of the outcome label of outbox_messages_total.
var relayOutcomes = []string{"published", "retried", "parked", "held"}

// DefaultCommitToPublishBuckets are the default
// RelayOptions.CommitToPublishBuckets: 1 ms to about 9 minutes, doubling.
var DefaultCommitToPublishBuckets = prom.ExponentialBuckets(0.001, 2, 20)

// RelayOptions configures RelayMetrics. The zero value is usable.
type RelayOptions struct {
	// Options gives the namespace, the constant labels and the
	// DurationBuckets of the publish latency histogram, as for Metrics.
	// Its ConstLabels may not use sink, kind, change or outcome either.
	Options
	// CommitToPublishBuckets are the upper bounds of the commit-to-publish
	// latency histogram, in seconds, strictly increasing. Defaults to
	// DefaultCommitToPublishBuckets.
	CommitToPublishBuckets []float64
}

// RelayMetrics turns outbox relay hook calls into Prometheus metrics. It
// implements outbox.RelayHook, WakeHook, LeaseHook, BacklogHook and LogHook,
// to pass in outbox.RelayConfig.Hooks or outbox.LogRelayConfig.Hooks, and
// prometheus.Collector, to register. It is
// safe for concurrent use by several relays; their series add up (the
// backlog gauges, the same for every relay, keep the last report).
type RelayMetrics struct {
	messages  *prom.CounterVec
	parked    *prom.CounterVec
	publish   *prom.HistogramVec
	latency   *prom.HistogramVec
	wakeups   *prom.CounterVec
	leases    *prom.CounterVec
	passErrs  prom.Counter
	waiting   *prom.GaugeVec
	oldest    *prom.GaugeVec
	slot      slotMetrics
	collected []prom.Collector

	mu    sync.Mutex
	sinks map[string]bool            // sinks the backlog gauges have reported
	last  map[string]outbox.LogStats // by log relay owner: its counters as last reported
}

var (
	_ outbox.RelayHook   = (*RelayMetrics)(nil)
	_ outbox.WakeHook    = (*RelayMetrics)(nil)
	_ outbox.LeaseHook   = (*RelayMetrics)(nil)
	_ outbox.BacklogHook = (*RelayMetrics)(nil)
	_ outbox.LogHook     = (*RelayMetrics)(nil)
	_ prom.Collector     = (*RelayMetrics)(nil)
)

// NewRelay returns RelayMetrics configured by opts. Register it with a
// prometheus.Registerer to export it.
func NewRelay(opts RelayOptions) (*RelayMetrics, error) {
	opts.Options = opts.Options.withDefaults()
	if opts.CommitToPublishBuckets == nil {
		opts.CommitToPublishBuckets = DefaultCommitToPublishBuckets
	}
	if err := opts.Options.validate(); err != nil {
		return nil, err
	}
	for name := range opts.ConstLabels {
		switch name {
		case labelSink, labelKind, labelChange, labelOutcome, labelSlot:
			return nil, &OptionsError{Field: "ConstLabels", Reason: fmt.Sprintf("label %q is set by the package itself", name)}
		}
	}
	b := opts.CommitToPublishBuckets
	if len(b) == 0 {
		return nil, &OptionsError{Field: "CommitToPublishBuckets", Reason: "must not be empty (leave it nil for the default)"}
	}
	for i := 1; i < len(b); i++ {
		if !(b[i] > b[i-1]) {
			return nil, &OptionsError{Field: "CommitToPublishBuckets", Reason: fmt.Sprintf("must be strictly increasing, got %v after %v", b[i], b[i-1])}
		}
	}
	ns, cl := opts.Namespace, prom.Labels(opts.ConstLabels)
	counter := func(name, help string, labels ...string) *prom.CounterVec {
		return prom.NewCounterVec(prom.CounterOpts{Namespace: ns, Name: name, Help: help, ConstLabels: cl}, labels)
	}
	gauge := func(name, help string) *prom.GaugeVec {
		return prom.NewGaugeVec(prom.GaugeOpts{Namespace: ns, Name: name, Help: help, ConstLabels: cl}, []string{labelSink})
	}
	histogram := func(name, help string, buckets []float64) *prom.HistogramVec {
		return prom.NewHistogramVec(prom.HistogramOpts{Namespace: ns, Name: name, Help: help, ConstLabels: cl, Buckets: buckets}, []string{labelSink})
	}
	m := &RelayMetrics{
		messages: counter("outbox_messages_total",
			"Outbox messages a relay handled, by sink and outcome: published, retried (failed transiently, tried again after a backoff), parked (refused for good) or held (behind a failure of their key, or failed while shutting down; tried again later).",
			labelSink, labelOutcome),
		parked: counter("outbox_parked_total", "Outbox messages parked because their sink refused them for good.", labelSink),
		publish: histogram("outbox_publish_duration_seconds",
			"Time a sink took to publish one pass's messages.", opts.DurationBuckets),
		latency: histogram("outbox_commit_to_publish_seconds",
			"Time from an outbox row's creation in the emitting transaction to its publish.", opts.CommitToPublishBuckets),
		wakeups: counter("outbox_wakeups_total",
			"Relay wake-ups by kind: notify (a NOTIFY from an emitting transaction) or poll (the poll interval ran out).", labelKind),
		leases: counter("outbox_lease_changes_total",
			"Partition lease changes by kind: acquired, lost (taken by another relay or expired) or released.", labelChange),
		passErrs: prom.NewCounter(prom.CounterOpts{Namespace: ns, Name: "outbox_pass_errors_total", ConstLabels: cl,
			Help: "Relay publish passes that ended in an error."}),
		waiting: gauge("outbox_waiting_rows", "Outbox rows waiting for a relay (unpublished, not parked), per sink, as last reported."),
		oldest: gauge("outbox_oldest_unpublished_seconds",
			"Age of the oldest outbox row waiting for a relay, per sink, as last reported; 0 when none waits."),
		slot:  newSlotMetrics(ns, cl),
		sinks: map[string]bool{},
		last:  map[string]outbox.LogStats{},
	}
	for _, k := range []outbox.WakeKind{outbox.WakeNotify, outbox.WakePoll} {
		m.wakeups.WithLabelValues(k.String())
	}
	for _, c := range []string{"acquired", "lost", "released"} {
		m.leases.WithLabelValues(c)
	}
	m.collected = append([]prom.Collector{m.messages, m.parked, m.publish, m.latency, m.wakeups, m.leases, m.passErrs, m.waiting, m.oldest},
		m.slot.collectors()...)
	return m, nil
}

// PassDone implements outbox.RelayHook.
func (m *RelayMetrics) PassDone(_ context.Context, s *outbox.PassStats) {
	if s.Err != nil {
		m.passErrs.Inc()
	}
	for _, p := range s.Sinks {
		for i, n := range []int{p.Published, p.Retried, p.Parked, p.Held} {
			// Every outcome's series exists from the sink's first pass.
			m.messages.WithLabelValues(p.Sink, relayOutcomes[i]).Add(float64(n))
		}
		m.parked.WithLabelValues(p.Sink).Add(float64(p.Parked))
		m.publish.WithLabelValues(p.Sink).Observe(p.Publish.Seconds())
		lat := m.latency.WithLabelValues(p.Sink)
		for _, d := range p.CommitToPublish {
			lat.Observe(d.Seconds())
		}
	}
}

// Woke implements outbox.WakeHook.
func (m *RelayMetrics) Woke(_ context.Context, _ string, k outbox.WakeKind) {
	m.wakeups.WithLabelValues(k.String()).Inc()
}

// LeasesChanged implements outbox.LeaseHook.
func (m *RelayMetrics) LeasesChanged(_ context.Context, e outbox.LeaseEvent) {
	m.leases.WithLabelValues("acquired").Add(float64(e.Acquired))
	m.leases.WithLabelValues("lost").Add(float64(e.Lost))
	m.leases.WithLabelValues("released").Add(float64(e.Released))
}

// Backlog implements outbox.BacklogHook: it sets the backlog gauges, and
// those of sinks no longer waiting to 0.
func (m *RelayMetrics) Backlog(_ context.Context, _ string, b []outbox.Backlog) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := make(map[string]bool, len(b))
	for _, x := range b {
		m.waiting.WithLabelValues(x.Sink).Set(float64(x.Waiting))
		m.oldest.WithLabelValues(x.Sink).Set(x.Oldest.Seconds())
		now[x.Sink] = true
		m.sinks[x.Sink] = true
	}
	for s := range m.sinks {
		if !now[s] {
			m.waiting.WithLabelValues(s).Set(0)
			m.oldest.WithLabelValues(s).Set(0)
		}
	}
}

// Describe implements prometheus.Collector.
func (m *RelayMetrics) Describe(ch chan<- *prom.Desc) {
	for _, c := range m.collected {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *RelayMetrics) Collect(ch chan<- prom.Metric) {
	for _, c := range m.collected {
		c.Collect(ch)
	}
}
