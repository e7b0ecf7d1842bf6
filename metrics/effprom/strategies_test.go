package effprom_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/metrics/effprom"
	prom "github.com/prometheus/client_golang/prometheus"
)

// seqKey keys a message by its sender and sequence number, carried in the
// message's ID as "sender seq".
func seqKey(m *consumer.Message) (dedupe.Key, error) {
	var sender string
	var seq int64
	if _, err := fmt.Sscanf(m.ID, "%s %d", &sender, &seq); err != nil {
		return dedupe.Key{}, err
	}
	return dedupe.Key{Sender: sender, Seq: seq}, nil
}

// TestHighwaterGapAndCache publishes one sender's second message before its
// first, so that exactly one message is held back as a gap, and checks the
// gap counters and the strategy's exported Stats.
func TestHighwaterGapAndCache(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	broker := consumertest.New(consumertest.Config{Lanes: 1})
	broker.Publish(0, consumer.Message{ID: "s0 2", Value: []byte("x")})
	broker.Publish(0, consumer.Message{ID: "s0 1", Value: []byte("x")})
	const senders, perSender = 5, 8
	for seq := 1; seq <= perSender; seq++ {
		for s := 1; s <= senders; s++ {
			broker.Publish(0, consumer.Message{ID: fmt.Sprintf("s%d %d", s, seq), Value: []byte("x")})
		}
	}
	// The first sender again, once: a duplicate answered by the cache.
	broker.Publish(0, consumer.Message{ID: "s1 1", Value: []byte("x")})

	strategy, err := highwater.New(highwater.Config{Mode: highwater.Strict})
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := effprom.New(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	strategies, err := effprom.NewStrategies(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(metrics, strategies)
	// Watched after registration: the series are not described, so the
	// registry accepts them whenever they appear.
	if err := strategies.Watch("marks", strategy); err != nil {
		t.Fatal(err)
	}
	if err := strategies.Watch("marks", strategy); !errors.Is(err, effprom.ErrAlreadyWatched) {
		t.Errorf("second Watch for one consumer: %v, want ErrAlreadyWatched", err)
	}
	run(t, pool, broker, consumer.Config{
		Name: "marks", Strategy: strategy, Handler: insertEffect, KeyFunc: seqKey,
		BatchSize: 1, Concurrency: 1, GapDelay: 20 * time.Millisecond,
		Hooks: []consumer.Hook{metrics},
	})

	s := gather(t, reg)
	want := map[string]float64{"applied": 2 + senders*perSender, "duplicate": 1, "gap": 1, "retried": 1, "parked": 0}
	for o, w := range want {
		if got := s.value(t, "effectively_messages_total", "consumer=marks", "outcome="+o); got != w {
			t.Errorf("messages_total{outcome=%q} = %v, want %v", o, got, w)
		}
	}
	st := strategy.Stats()
	for name, w := range map[string]float64{
		"effectively_highwater_gaps_total":            float64(st.Gaps),
		"effectively_highwater_cache_hits_total":      float64(st.CacheHits),
		"effectively_highwater_cache_misses_total":    float64(st.CacheMisses),
		"effectively_highwater_cache_evictions_total": float64(st.CacheEvictions),
		"effectively_highwater_cache_entries":         float64(st.CacheEntries),
		"effectively_highwater_stuck_senders":         float64(st.StuckSenders),
	} {
		if got := s.value(t, name, "consumer=marks"); got != w {
			t.Errorf("%s = %v, Stats says %v", name, got, w)
		}
	}
	if st.Gaps != 1 || st.CacheHits == 0 || st.CacheEntries != senders+1 {
		t.Errorf("strategy stats %+v: want one gap, some cache hits and %d cached senders", st, senders+1)
	}
	strategies.Unwatch("marks")
	if _, ok := gather(t, reg)["effectively_highwater_gaps_total"]; ok {
		t.Error("highwater metrics still exported after Unwatch")
	}
}

// TestBloomStats runs a bloom strategy and checks that a scrape reports its
// Stats.
func TestBloomStats(t *testing.T) {
	t.Parallel()
	const n, dups = 200, 20
	pool := newPool(t)
	broker := consumertest.New(consumertest.Config{Lanes: 2})
	for i := range n {
		broker.Publish(i, consumer.Message{ID: id("m", i), Value: []byte("x")})
	}
	for i := range dups {
		broker.Publish(i, consumer.Message{ID: id("m", i), Value: []byte("x")})
	}
	strategy, err := bloom.New(bloom.Config{ExpectedKeysPerSlice: 10000})
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := effprom.New(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	strategies, err := effprom.NewStrategies(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := strategies.Watch("events", strategy); err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(metrics, strategies)
	cfg := consumer.Config{Name: "events", Strategy: strategy, Handler: insertEffect, BatchSize: 50, Hooks: []consumer.Hook{metrics}}
	consumertest.NewConsumer(t, pool, broker, cfg) // migrates the strategy's tables for Maintain
	ctx := context.Background()
	if err := strategy.Maintain(ctx, pool); err != nil {
		t.Fatal(err)
	}
	run(t, pool, broker, cfg)

	s := gather(t, reg)
	st := strategy.Stats()
	if st.Keys != n+dups || st.New != n || st.FilterBytes == 0 {
		t.Errorf("strategy stats %+v: want %d keys, %d new and a filter", st, n+dups, n)
	}
	warm := 0.0
	if st.Warm {
		warm = 1
	}
	for name, w := range map[string]float64{
		"effectively_bloom_keys_total":               float64(st.Keys),
		"effectively_bloom_new_keys_total":           float64(st.New),
		"effectively_bloom_filter_bytes":             float64(st.FilterBytes),
		"effectively_bloom_filter_slices":            float64(st.Slices),
		"effectively_bloom_filter_tests_total":       float64(st.Tests),
		"effectively_bloom_filter_positives_total":   float64(st.Positives),
		"effectively_bloom_false_positives_total":    float64(st.FalsePositives),
		"effectively_bloom_false_positive_ratio":     st.FalsePositiveRate,
		"effectively_bloom_probes_total":             float64(st.Probes),
		"effectively_bloom_probes_saved_total":       float64(st.ProbesSaved),
		"effectively_bloom_conflicts_total":          float64(st.Conflicts),
		"effectively_bloom_sealed_slices_total":      float64(st.Sealed),
		"effectively_bloom_dropped_partitions_total": float64(st.Dropped),
		"effectively_bloom_warm":                     warm,
	} {
		if got := s.value(t, name, "consumer=events"); got != w {
			t.Errorf("%s = %v, Stats says %v", name, got, w)
		}
	}
	if got := s.value(t, "effectively_messages_total", "consumer=events", "outcome=duplicate"); got != dups {
		t.Errorf("duplicates %v, want %d", got, dups)
	}
	if count, _ := s.histogram(t, "effectively_claim_duration_seconds", "consumer=events", "strategy=bloom"); count == 0 {
		t.Error("no claim durations for strategy bloom")
	}
}

// reporting is idset (which reports no statistics) with a report of its
// own: any strategy that implements dedupe.StatsReporter is exported.
type reporting struct {
	*idset.Strategy
	name  string
	stats func() []dedupe.Stat
}

var _ dedupe.StatsReporter = reporting{}

func (r reporting) Name() string               { return r.name }
func (r reporting) ReportStats() []dedupe.Stat { return r.stats() }

func newReporting(t *testing.T, name string, stats func() []dedupe.Stat) reporting {
	t.Helper()
	s, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return reporting{Strategy: s, name: name, stats: stats}
}

// TestWatchAnyReporter: a strategy effprom knows nothing of is exported
// through dedupe.StatsReporter, under its name, with its kinds and help
// texts, and its values read at each scrape; a strategy without a report
// is skipped, and leaves its consumer free to watch another.
func TestWatchAnyReporter(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	custom := newReporting(t, "custom", func() []dedupe.Stat {
		return []dedupe.Stat{
			{Name: "hits_total", Help: "Hits.", Kind: dedupe.StatCounter, Value: float64(hits.Load())},
			{Name: "entries", Help: "Entries.", Kind: dedupe.StatGauge, Value: 7},
		}
	})
	plain, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	strategies, err := effprom.NewStrategies(effprom.Options{Namespace: "app", ConstLabels: map[string]string{"service": "billing"}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(strategies)

	if err := strategies.Watch("orders", plain); err != nil {
		t.Fatalf("Watch of a strategy without statistics: %v, want nil", err)
	}
	if s := gather(t, reg); len(s) != 0 {
		t.Errorf("a strategy without statistics exported %d families", len(s))
	}
	if err := strategies.Watch("orders", custom); err != nil {
		t.Fatalf("Watch of a reporter after a strategy without statistics: %v", err)
	}
	hits.Store(3)
	s := gather(t, reg)
	if got := s.value(t, "app_custom_hits_total", "consumer=orders", "service=billing"); got != 3 {
		t.Errorf("app_custom_hits_total = %v, want 3", got)
	}
	hits.Store(5)
	s = gather(t, reg)
	if got := s.value(t, "app_custom_hits_total", "consumer=orders"); got != 5 {
		t.Errorf("app_custom_hits_total after more hits = %v, want 5", got)
	}
	if got := s.value(t, "app_custom_entries", "consumer=orders"); got != 7 {
		t.Errorf("app_custom_entries = %v, want 7", got)
	}
	if mf := s["app_custom_hits_total"]; mf.GetType().String() != "COUNTER" || mf.GetHelp() != "Hits." {
		t.Errorf("app_custom_hits_total is a %s with help %q, want a COUNTER with help %q", mf.GetType(), mf.GetHelp(), "Hits.")
	}
	if mf := s["app_custom_entries"]; mf.GetType().String() != "GAUGE" {
		t.Errorf("app_custom_entries is a %s, want a GAUGE", mf.GetType())
	}
	// A second consumer with a strategy of the same name shares the
	// families.
	if err := strategies.Watch("payments", custom); err != nil {
		t.Fatal(err)
	}
	if got := gather(t, reg).value(t, "app_custom_hits_total", "consumer=payments"); got != 5 {
		t.Errorf("app_custom_hits_total{consumer=payments} = %v, want 5", got)
	}
}

// TestWatchRefusesBadReports: names that would not make valid or
// consistent series are refused by Watch, with nothing exported; a report
// that changes after Watch fails the scrape instead of exporting a series
// the watch did not check.
func TestWatchRefusesBadReports(t *testing.T) {
	t.Parallel()
	counter := func(name, help string) func() []dedupe.Stat {
		return func() []dedupe.Stat {
			return []dedupe.Stat{{Name: name, Help: help, Kind: dedupe.StatCounter, Value: 1}}
		}
	}
	strategies, err := effprom.NewStrategies(effprom.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := strategies.Watch("c", newReporting(t, "custom", counter("hits_total", "Hits."))); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		s    reporting
		want string
	}{
		{"a strategy name with a dash", newReporting(t, "my-strategy", counter("hits_total", "Hits.")), "not a valid part of a metric name"},
		{"a stat name that is not snake_case", newReporting(t, "other", counter("Hits", "Hits.")), "snake_case"},
		{"a counter without _total", newReporting(t, "other", counter("hits", "Hits.")), "_total"},
		{"the same series with another help text", newReporting(t, "custom", counter("hits_total", "Other hits.")), "already exported"},
		{"the same series as a gauge", newReporting(t, "custom", func() []dedupe.Stat {
			return []dedupe.Stat{{Name: "hits_total", Help: "Hits.", Kind: dedupe.StatGauge}}
		}), "already exported"},
	} {
		err := strategies.Watch("d", tc.s)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Watch returned %v, want an error saying %q", tc.what, err, tc.want)
		}
	}
	if err := strategies.Watch("c", nil); err == nil {
		t.Error("Watch(nil) returned nil")
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(strategies)
	if s := gather(t, reg); len(s) != 1 {
		t.Errorf("exported %d families, want only the first strategy's", len(s))
	}

	var renamed atomic.Bool
	strategies.Unwatch("c")
	if err := strategies.Watch("c", newReporting(t, "custom", func() []dedupe.Stat {
		name := "hits_total"
		if renamed.Load() {
			name = "misses_total"
		}
		return []dedupe.Stat{{Name: name, Help: "Hits.", Kind: dedupe.StatCounter, Value: 1}}
	})); err != nil {
		t.Fatal(err)
	}
	renamed.Store(true)
	if _, err := reg.Gather(); err == nil || !strings.Contains(err.Error(), "misses_total") {
		t.Errorf("gather after the report changed: %v, want an error naming misses_total", err)
	}
}

// TestNoStrategyPackages: the adapter reads strategies through
// dedupe.StatsReporter only, and links none of the strategy packages.
func TestNoStrategyPackages(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, s := range []string{"highwater", "bloom", "idset"} {
			if pkg == "github.com/effectively-once/effectively/dedupe/"+s {
				t.Errorf("effprom depends on %s", pkg)
			}
		}
	}
}
