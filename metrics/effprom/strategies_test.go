package effprom_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/highwater"
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
	if err := metrics.WatchHighwater("marks", strategy); err != nil {
		t.Fatal(err)
	}
	if err := metrics.WatchHighwater("marks", strategy); !errors.Is(err, effprom.ErrAlreadyWatched) {
		t.Errorf("second WatchHighwater for one consumer: %v, want ErrAlreadyWatched", err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(metrics)
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
	metrics.Unwatch("marks")
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
	if err := metrics.WatchBloom("events", strategy); err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(metrics)
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
