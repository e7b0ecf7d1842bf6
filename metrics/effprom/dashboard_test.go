package effprom_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/dedupe/switchover"
	"github.com/effectively-once/effectively/metrics/effprom"
	"github.com/effectively-once/effectively/outbox"
	prom "github.com/prometheus/client_golang/prometheus"
)

// dashboardFile is the Grafana dashboard shipped for this adapter.
const dashboardFile = "dashboard/effectively.json"

// Every series the dashboard queries is one the adapter registers, with
// the labels the dashboard filters and groups by: a metric or label
// renamed in the adapter fails this test, not the dashboard.
func TestDashboardQueriesRegisteredSeries(t *testing.T) {
	t.Parallel()
	registered := registeredSeries(t)
	queries := dashboardQueries(t)
	if len(queries) < 20 {
		t.Fatalf("found %d queries in %s: the dashboard was not read", len(queries), dashboardFile)
	}
	used := map[string]bool{}
	for _, q := range queries {
		refs, err := parsePromQL(q.expr)
		if err != nil {
			t.Errorf("%s: %v", q.where, err)
			continue
		}
		if len(refs.metrics) == 0 {
			t.Errorf("%s: no metric in %q", q.where, q.expr)
		}
		var exprLabels []string
		for _, m := range refs.metrics {
			labels, ok := registered[m.name]
			if !ok {
				t.Errorf("%s: metric %s is not registered by effprom (registered: %s)", q.where, m.name, strings.Join(sortedKeys(registered), ", "))
				continue
			}
			used[m.name] = true
			exprLabels = append(exprLabels, labels...)
			for _, l := range m.labels {
				if !slices.Contains(labels, l) {
					t.Errorf("%s: metric %s has no label %q (it has %v)", q.where, m.name, l, labels)
				}
			}
		}
		for _, l := range refs.grouping {
			if !slices.Contains(exprLabels, l) {
				t.Errorf("%s: groups by %q, which none of its metrics has", q.where, l)
			}
		}
	}
	// The areas the dashboard promises, each queried.
	for _, m := range []string{
		"effectively_messages_total", "effectively_batches_total", "effectively_lag_messages",
		"effectively_batch_duration_seconds_bucket", "effectively_commit_duration_seconds_bucket",
		"effectively_parked_total", "effectively_outbox_waiting_rows",
		"effectively_outbox_commit_to_publish_seconds_bucket", "effectively_shadow_verdicts_total",
		"effectively_switchover_consulting", "effectively_outbox_slot_lag_bytes", "effectively_outbox_slot_losses_total",
		"effectively_outbox_slot_reported_timestamp_seconds",
	} {
		if !used[m] {
			t.Errorf("the dashboard does not query %s", m)
		}
	}
}

// registeredSeries registers the adapter's collectors in a fresh registry,
// drives one batch, message, lag report and relay pass through the hooks
// so that every series exists, and returns each gathered series name
// (histograms as _bucket, _sum and _count) with its label names.
func registeredSeries(t *testing.T) map[string][]string {
	t.Helper()
	ctx := context.Background()
	m, err := effprom.New(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	relay, err := effprom.NewRelay(effprom.RelayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hw, err := highwater.New(highwater.Config{})
	if err != nil {
		t.Fatal(err)
	}
	bl, err := bloom.New(bloom.Config{})
	if err != nil {
		t.Fatal(err)
	}
	strategies, err := effprom.NewStrategies(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := strategies.Watch("c", hw); err != nil {
		t.Fatal(err)
	}
	if err := strategies.Watch("b", bl); err != nil {
		t.Fatal(err)
	}
	sw, err := effprom.NewSwitchover(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	old, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sh, err := switchover.NewShadow(switchover.ShadowConfig{Live: old, Shadow: bl})
	if err != nil {
		t.Fatal(err)
	}
	mig, err := switchover.New(switchover.Config{Old: old, New: bl, Until: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if err := sw.WatchShadow("c", sh); err != nil {
		t.Fatal(err)
	}
	if err := sw.WatchMigration("c", mig); err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(m, relay, sw, strategies)

	info := consumer.BatchInfo{Consumer: "c", Strategy: "idset", Lane: "l", Batch: 1, Size: 3}
	m.BatchDone(ctx, &consumer.BatchStats{BatchInfo: info, Applied: 1, Duplicate: 1, Parked: 1, Reruns: 1,
		Total: time.Millisecond, Claim: time.Millisecond, Handle: time.Millisecond, Commit: time.Millisecond, Ack: time.Millisecond})
	m.MessageDone(ctx, consumer.MessageEvent{BatchInfo: info, Message: &consumer.Message{ID: "a", Time: time.Now()}, Outcome: consumer.OutcomeApplied})
	m.MessageDone(ctx, consumer.MessageEvent{BatchInfo: info, Message: &consumer.Message{ID: "b"}, Outcome: consumer.OutcomeParked,
		Err: &consumer.ParkedError{Reason: "permanent", Err: errors.New("poison")}})
	m.SetLag("c", "orders/0", 3)

	relay.PassDone(ctx, &outbox.PassStats{Owner: "r", Read: 1, Err: errors.New("broker down"), Sinks: []outbox.SinkPass{
		{Sink: "kafka", Published: 1, Publish: time.Millisecond, CommitToPublish: []time.Duration{time.Millisecond}}}})
	relay.Woke(ctx, "r", outbox.WakePoll)
	relay.LeasesChanged(ctx, outbox.LeaseEvent{Owner: "r", Acquired: 1})
	relay.Backlog(ctx, "r", []outbox.Backlog{{Sink: "kafka", Waiting: 2, Oldest: time.Second}})
	relay.SlotLag(ctx, outbox.LogStats{Slot: "s", Owner: "r", Active: true, Reconnects: 1, SlotsLost: 1, SlotsCreated: 2,
		Recovered: 3, OldestUnconfirmed: time.Second}, 4096)

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, mf := range mfs {
		var labels []string
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if !slices.Contains(labels, lp.GetName()) {
					labels = append(labels, lp.GetName())
				}
			}
		}
		name := mf.GetName()
		if mf.GetType().String() == "HISTOGRAM" {
			out[name+"_bucket"] = append(slices.Clone(labels), "le")
			out[name+"_sum"] = labels
			out[name+"_count"] = labels
			continue
		}
		out[name] = labels
	}
	return out
}

// query is one PromQL expression of the dashboard and where it is.
type query struct{ where, expr string }

// dashboardQueries returns every panel target's expression and every
// templating variable's query.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
			Panels []json.RawMessage `json:"panels"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []query
	for _, p := range d.Panels {
		if len(p.Panels) > 0 {
			t.Errorf("row %q holds collapsed panels, which this test does not read", p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, query{"panel " + p.Title, tg.Expr})
		}
	}
	labelValues := regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(metric, label)", v.Name, v.Definition)
			continue
		}
		// The same check as a selector grouped by the label.
		out = append(out, query{"variable " + v.Name, "sum by (" + m[2] + ") (" + m[1] + ")"})
	}
	return out
}

// promRefs are the metrics (with the labels their matchers name) and the
// grouping labels of one PromQL expression.
type promRefs struct {
	metrics  []metricRef
	grouping []string
}

type metricRef struct {
	name   string
	labels []string
}

var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	promSelector = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}`)
	promMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
		"group_right": true, "and": true, "or": true, "unless": true, "bool": true, "offset": true, "inf": true, "nan": true}
)

// parsePromQL finds the metric names and labels of a PromQL expression
// (enough of PromQL for a dashboard: selectors, functions, aggregations
// with by/without, binary operators, ranges and Grafana's $variables).
func parsePromQL(expr string) (promRefs, error) {
	var r promRefs
	s := promString.ReplaceAllString(expr, `""`) // label values may hold anything
	s = promRange.ReplaceAllString(s, "")
	for _, g := range promGrouping.FindAllStringSubmatch(s, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				r.grouping = append(r.grouping, l)
			}
		}
	}
	s = promGrouping.ReplaceAllString(s, "")
	for _, sel := range promSelector.FindAllStringSubmatch(s, -1) {
		if sel[1] == "" {
			return r, errors.New("a selector without a metric name: " + sel[0])
		}
		m := metricRef{name: sel[1]}
		for _, lm := range promMatcher.FindAllStringSubmatch(sel[2], -1) {
			m.labels = append(m.labels, lm[1])
		}
		r.metrics = append(r.metrics, m)
	}
	s = promSelector.ReplaceAllString(s, " ")
	s = regexp.MustCompile(`\$[a-zA-Z_]+`).ReplaceAllString(s, " ")
	for _, id := range promIdent.FindAllStringSubmatch(s, -1) {
		name := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(id[0]), "("))
		if id[1] != "" || promKeywords[strings.ToLower(name)] {
			continue // a function or an aggregation, or a keyword
		}
		r.metrics = append(r.metrics, metricRef{name: name})
	}
	return r, nil
}

func TestParsePromQL(t *testing.T) {
	t.Parallel()
	r, err := parsePromQL(`histogram_quantile(0.99, sum by (consumer, le) (rate(a_bucket{consumer=~"$consumer", x!="}"}[$__rate_interval]))) / on (consumer) b + sum without(lane) (c{y="1"}) > bool 0`)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range r.metrics {
		names = append(names, m.name+"{"+strings.Join(m.labels, ",")+"}")
	}
	sort.Strings(names)
	if got, want := strings.Join(names, " "), "a_bucket{consumer,x} b{} c{y}"; got != want {
		t.Errorf("metrics %s, want %s", got, want)
	}
	if got, want := strings.Join(r.grouping, " "), "consumer le consumer lane"; got != want {
		t.Errorf("grouping %s, want %s", got, want)
	}
}

func sortedKeys(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
