package effprom_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/metrics/effprom"
	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	prom "github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// relaySink is a Sink that publishes into memory, refuses the IDs in
// refuse for good and fails those in fail every time.
type relaySink struct {
	mu     sync.Mutex
	got    []string
	refuse map[string]bool
	fail   map[string]bool
}

func (s *relaySink) Publish(ctx context.Context, msgs []outbox.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := outbox.PublishErrors{}
	for i, m := range msgs {
		switch {
		case s.refuse[m.ID]:
			errs[i] = outbox.Permanent(errors.New("too large"))
		case s.fail[m.ID]:
			errs[i] = errors.New("broker unavailable")
		default:
			s.got = append(s.got, m.ID)
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// tryValue returns the value of the one counter or gauge of family name
// with labels, and false if there is none.
func tryValue(reg prom.Gatherer, name string, labels map[string]string) (float64, bool) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			if m.Counter != nil {
				return m.Counter.GetValue(), true
			}
			return m.Gauge.GetValue(), true
		}
	}
	return 0, false
}

// TestRelayMetrics runs a real relay over Postgres with the collector as
// its hook: the counters match what the sink did, the latencies are
// observed once per published message, the backlog gauges show the row
// left on its retry path, and the metrics pass the linter.
func TestRelayMetrics(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	o, err := outbox.New(outbox.Config{Mode: outbox.TableMode})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Migrate(ctx, pool, "", o.Line()); err != nil {
		t.Fatal(err)
	}
	const ok = 8
	msgs := []outbox.Message{
		{Sink: "orders", Key: []byte("a"), ID: "bad", Value: []byte("x")},
		{Sink: "orders", Key: []byte("b"), ID: "slow", Value: []byte("x")},
	}
	for i := range ok {
		msgs = append(msgs, outbox.Message{Sink: "orders", Key: []byte(fmt.Sprint(i)), ID: fmt.Sprintf("m%d", i), Value: []byte("x")})
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return o.Emit(ctx, tx, msgs...) }); err != nil {
		t.Fatal(err)
	}

	m, err := effprom.NewRelay(effprom.RelayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(m)
	sink := &relaySink{refuse: map[string]bool{"bad": true}, fail: map[string]bool{"slow": true}}
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Sinks: map[string]outbox.Sink{"orders": sink},
		Hooks: []outbox.RelayHook{m}, PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second,
		MinBackoff: time.Hour, MaxBackoff: time.Hour, BacklogInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { cancel(); <-done }()

	orders := func(k, v string) map[string]string { return map[string]string{"sink": "orders", k: v} }
	deadline := time.Now().Add(60 * time.Second)
	for {
		pub, _ := tryValue(reg, "effectively_outbox_messages_total", orders("outcome", "published"))
		parked, _ := tryValue(reg, "effectively_outbox_parked_total", map[string]string{"sink": "orders"})
		waiting, _ := tryValue(reg, "effectively_outbox_waiting_rows", map[string]string{"sink": "orders"})
		if pub == ok && parked == 1 && waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out: published %v parked %v waiting %v", pub, parked, waiting)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil // for the deferred receive

	s := gather(t, reg)
	if v := s.value(t, "effectively_outbox_messages_total", "sink=orders", "outcome=retried"); v != 1 {
		t.Errorf("retried %v, want 1 (the backoff is an hour)", v)
	}
	if v := s.value(t, "effectively_outbox_messages_total", "sink=orders", "outcome=parked"); v != 1 {
		t.Errorf("parked outcome %v, want 1", v)
	}
	if count, sum := s.histogram(t, "effectively_outbox_commit_to_publish_seconds", "sink=orders"); count != ok || sum <= 0 {
		t.Errorf("commit_to_publish: count %d sum %v, want count %d", count, sum, ok)
	}
	if count, _ := s.histogram(t, "effectively_outbox_publish_duration_seconds", "sink=orders"); count == 0 {
		t.Error("no publish latency observed")
	}
	if v := s.value(t, "effectively_outbox_oldest_unpublished_seconds", "sink=orders"); v <= 0 || v > 60 {
		t.Errorf("oldest unpublished %v s", v)
	}
	if v := s.value(t, "effectively_outbox_lease_changes_total", "change=acquired"); v != outbox.Partitions {
		t.Errorf("leases acquired %v, want %d", v, outbox.Partitions)
	}
	if v := s.value(t, "effectively_outbox_lease_changes_total", "change=released"); v != outbox.Partitions {
		t.Errorf("leases released at shutdown %v, want %d", v, outbox.Partitions)
	}
	notify := s.value(t, "effectively_outbox_wakeups_total", "kind=notify")
	poll := s.value(t, "effectively_outbox_wakeups_total", "kind=poll")
	if poll == 0 {
		t.Errorf("wake-ups: notify %v, poll %v; a 20ms poll interval must have woken it", notify, poll)
	}

	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestRelayOptionsValidation: a constant label the collector sets itself
// and bad buckets are refused.
func TestRelayOptionsValidation(t *testing.T) {
	for _, opts := range []effprom.RelayOptions{
		{Options: effprom.Options{ConstLabels: map[string]string{"sink": "x"}}},
		{CommitToPublishBuckets: []float64{}},
		{CommitToPublishBuckets: []float64{1, 1}},
		{Options: effprom.Options{Namespace: "1bad"}},
	} {
		if _, err := effprom.NewRelay(opts); !errors.Is(err, effprom.ErrInvalidOptions) {
			t.Errorf("NewRelay(%+v) = %v, want ErrInvalidOptions", opts, err)
		}
	}
}
