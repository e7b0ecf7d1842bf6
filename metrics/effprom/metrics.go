package effprom

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/effectively-once/effectively/consumer"
	prom "github.com/prometheus/client_golang/prometheus"
)

const (
	labelConsumer = "consumer"
	labelOutcome  = "outcome"
	labelResult   = "result"
	labelStrategy = "strategy"
	labelLane     = "lane"
	labelReason   = "reason"
)

// Values of the outcome label of messages_total.
var outcomes = []string{"applied", "duplicate", "mismatch", "parked", "retried", "gap", "unknown"}

// Values of the result label of batches_total.
const (
	resultOK       = "ok"
	resultIsolated = "isolated"
	resultFenced   = "fenced"
	resultError    = "error"
	// resultUnknown: the connection was lost during COMMIT; redelivery
	// settles the batch's messages.
	resultUnknown = "unknown"
)

var results = []string{resultOK, resultIsolated, resultFenced, resultError, resultUnknown}

// Metrics turns consumer hook calls into Prometheus metrics. It implements
// consumer.Hook and consumer.MessageHook, to pass in consumer.Config.Hooks,
// and prometheus.Collector, to register. It is safe for concurrent use by
// several consumers.
type Metrics struct {
	opts Options

	messages  *prom.CounterVec
	batches   *prom.CounterVec
	reruns    *prom.CounterVec
	standby   *prom.CounterVec
	size      *prom.HistogramVec
	duration  *prom.HistogramVec
	claim     *prom.HistogramVec
	handle    *prom.HistogramVec
	commit    *prom.HistogramVec
	ack       *prom.HistogramVec
	age       *prom.HistogramVec
	parked    *prom.CounterVec
	lag       *prom.GaugeVec
	collected []prom.Collector

	series sync.Map // consumer name → *series

}

var (
	_ consumer.Hook        = (*Metrics)(nil)
	_ consumer.MessageHook = (*Metrics)(nil)
	_ prom.Collector       = (*Metrics)(nil)
)

// New returns Metrics configured by opts. Register it with a
// prometheus.Registerer to export it.
func New(opts Options) (*Metrics, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ns, cl := opts.Namespace, prom.Labels(opts.ConstLabels)
	counter := func(name, help string, labels ...string) *prom.CounterVec {
		return prom.NewCounterVec(prom.CounterOpts{Namespace: ns, Name: name, Help: help, ConstLabels: cl}, labels)
	}
	histogram := func(name, help string, buckets []float64, labels ...string) *prom.HistogramVec {
		return prom.NewHistogramVec(prom.HistogramOpts{Namespace: ns, Name: name, Help: help, ConstLabels: cl, Buckets: buckets}, labels)
	}
	d := opts.DurationBuckets
	m := &Metrics{
		opts: opts,
		messages: counter("messages_total",
			"Messages by outcome: applied, duplicate, mismatch, parked, retried, and gap (retried because their sequence number was ahead; also counted as retried).",
			labelConsumer, labelOutcome),
		batches: counter("batches_total",
			"Batches by result: ok, isolated (committed after isolating a failing handler), fenced (dropped: the lane has a newer owner) or error (rolled back and redelivered).",
			labelConsumer, labelResult),
		reruns: counter("handler_reruns_total",
			"Handler calls beyond the first for a message within one batch: healthy messages re-run while a failing batch-mate was isolated. Their effects were rolled back; anything a handler did outside the transaction happened again.",
			labelConsumer),
		standby: counter("standby_unconfirmed_batches_total",
			"Batches acknowledged although fewer standbys than consumer.Config.StandbyAck requires confirmed their commit within StandbyAck.Timeout: a failover to an asynchronous standby that lacks them loses them.",
			labelConsumer),
		size:     histogram("batch_size", "Messages fetched per batch.", opts.BatchSizeBuckets, labelConsumer),
		duration: histogram("batch_duration_seconds", "Time from a batch's start to its settlement with the source.", d, labelConsumer),
		claim:    histogram("claim_duration_seconds", "Time the dedupe strategy spent claiming a batch's keys.", d, labelConsumer, labelStrategy),
		handle:   histogram("handle_duration_seconds", "Time spent in the handler for a batch.", d, labelConsumer),
		commit:   histogram("commit_duration_seconds", "Time to commit a batch's transaction.", d, labelConsumer),
		ack:      histogram("ack_duration_seconds", "Time to acknowledge a committed batch to its source.", d, labelConsumer),
		age: histogram("message_age_seconds",
			"Time from the broker accepting an applied message to its batch being settled.", opts.MessageAgeBuckets, labelConsumer),
		parked: counter("parked_total",
			"Parked messages by reason: invalid_key, permanent, max_attempts, mismatch or gap.",
			labelConsumer, labelReason),
		lag: prom.NewGaugeVec(prom.GaugeOpts{Namespace: ns, Name: "lag_messages", ConstLabels: cl,
			Help: "Messages the consumer is behind its source, per lane, as last reported with SetLag."}, []string{labelConsumer, labelLane}),
	}
	m.collected = []prom.Collector{m.messages, m.batches, m.reruns, m.standby, m.size, m.duration, m.claim, m.handle, m.commit, m.ack, m.age, m.parked, m.lag}
	return m, nil
}

// series are one consumer's children of the vectors, created with zero
// values the first time the consumer reports, so that rates of outcomes
// that have not happened yet are 0 rather than missing.
type series struct {
	messages map[string]prom.Counter
	batches  map[string]prom.Counter
	reruns   prom.Counter
	standby  prom.Counter
	size     prom.Observer
	duration prom.Observer
	handle   prom.Observer
	commit   prom.Observer
	ack      prom.Observer
	age      prom.Observer
}

func (m *Metrics) seriesOf(name string) *series {
	if s, ok := m.series.Load(name); ok {
		return s.(*series)
	}
	s := &series{
		messages: make(map[string]prom.Counter, len(outcomes)),
		batches:  make(map[string]prom.Counter, len(results)),
		reruns:   m.reruns.WithLabelValues(name),
		standby:  m.standby.WithLabelValues(name),
		size:     m.size.WithLabelValues(name),
		duration: m.duration.WithLabelValues(name),
		handle:   m.handle.WithLabelValues(name),
		commit:   m.commit.WithLabelValues(name),
		ack:      m.ack.WithLabelValues(name),
		age:      m.age.WithLabelValues(name),
	}
	for _, o := range outcomes {
		s.messages[o] = m.messages.WithLabelValues(name, o)
	}
	for _, r := range results {
		s.batches[r] = m.batches.WithLabelValues(name, r)
	}
	actual, _ := m.series.LoadOrStore(name, s)
	return actual.(*series)
}

// BatchDone implements consumer.Hook.
func (m *Metrics) BatchDone(_ context.Context, st *consumer.BatchStats) {
	s := m.seriesOf(st.Consumer)
	add := func(outcome string, n int) {
		if n > 0 {
			s.messages[outcome].Add(float64(n))
		}
	}
	add("applied", st.Applied)
	add("duplicate", st.Duplicate)
	add("mismatch", st.Mismatch)
	add("parked", st.Parked)
	add("retried", st.Retried)
	add("gap", st.Gap)
	add("unknown", st.Unknown)
	if st.Reruns > 0 {
		s.reruns.Add(float64(st.Reruns))
	}
	if st.StandbyUnconfirmed {
		s.standby.Inc()
	}

	result := resultOK
	switch {
	case st.Fenced:
		result = resultFenced
	case st.Unknown > 0:
		result = resultUnknown
	case st.Err != nil:
		result = resultError
	case st.Isolated:
		result = resultIsolated
	}
	s.batches[result].Inc()

	s.size.Observe(float64(st.Size))
	s.duration.Observe(st.Total.Seconds())
	if st.Claim > 0 {
		m.claim.WithLabelValues(st.Consumer, st.Strategy).Observe(st.Claim.Seconds())
	}
	if st.Handle > 0 {
		s.handle.Observe(st.Handle.Seconds())
	}
	if st.Commit > 0 {
		s.commit.Observe(st.Commit.Seconds())
	}
	if st.Err == nil && st.Ack > 0 {
		s.ack.Observe(st.Ack.Seconds())
	}
}

// MessageDone implements consumer.MessageHook. It counts parked messages
// by reason and observes the age of applied messages whose source reports
// when it accepted them.
func (m *Metrics) MessageDone(_ context.Context, e consumer.MessageEvent) {
	if e.Outcome == consumer.OutcomeParked {
		var pe *consumer.ParkedError
		if errors.As(e.Err, &pe) {
			m.parked.WithLabelValues(e.Consumer, pe.Reason).Inc()
		}
		return
	}
	if e.Outcome != consumer.OutcomeApplied || e.Message.Time.IsZero() {
		return
	}
	m.seriesOf(e.Consumer).age.Observe(time.Since(e.Message.Time).Seconds())
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prom.Desc) {
	for _, c := range m.collected {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prom.Metric) {
	for _, c := range m.collected {
		c.Collect(ch)
	}
}
