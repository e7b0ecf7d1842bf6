package effprom_test

import (
	"context"
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

// TestLogRelayMetrics runs a real log relay with the collector as its hook:
// the slot's creation, lag and report time show; a slot dropped under the
// relay shows as a lost stream and a lost slot, counted once each time
// however often the relay reports; the metrics pass the linter.
func TestLogRelayMetrics(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	o, err := outbox.New(outbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Migrate(ctx, pool, "", o.Line()); err != nil {
		t.Fatal(err)
	}
	m, err := effprom.NewRelay(effprom.RelayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prom.NewPedanticRegistry()
	reg.MustRegister(m)
	sink := &relaySink{refuse: map[string]bool{}, fail: map[string]bool{}}
	r, err := outbox.NewLogRelay(pool, outbox.LogRelayConfig{Sinks: map[string]outbox.Sink{"s": sink},
		LagInterval: 20 * time.Millisecond, StatusInterval: 20 * time.Millisecond, StandbyRetry: 20 * time.Millisecond,
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, Hooks: []outbox.RelayHook{m}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	slot := map[string]string{"slot": r.Stats().Slot}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	value := func(name string) float64 {
		v, _ := tryValue(reg, name, slot)
		return v
	}
	waitFor("the slot's first report", func() bool { return value("effectively_outbox_slot_reported_timestamp_seconds") > 0 })
	if got := value("effectively_outbox_slot_creations_total"); got != 1 {
		t.Fatalf("outbox_slot_creations_total = %v, want 1", got)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return o.Emit(ctx, tx, outbox.Message{Sink: "s", Key: []byte("k"), ID: "a", Value: []byte("v")})
	}); err != nil {
		t.Fatal(err)
	}
	waitFor("the message published", func() bool { return r.Stats().Published == 1 })

	// The slot dropped under the reading relay: it loses its stream (the
	// walsender is ended to let the drop happen), finds the slot gone and
	// creates it again.
	for dropped := false; !dropped; {
		if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active`, slot["slot"]); err != nil {
			t.Fatal(err)
		}
		// Refused while the relay has taken the slot again: terminate again.
		_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot["slot"])
		dropped = err == nil
	}
	waitFor("the stream's loss reported", func() bool { return value("effectively_outbox_slot_reconnects_total") >= 1 })
	waitFor("the loss reported", func() bool { return value("effectively_outbox_slot_losses_total") == 1 })
	waitFor("a report matching the relay's counts", func() bool {
		st := r.Stats()
		return value("effectively_outbox_slot_reconnects_total") == float64(st.Reconnects) &&
			value("effectively_outbox_slot_losses_total") == float64(st.SlotsLost) &&
			value("effectively_outbox_slot_creations_total") == float64(st.SlotsCreated)
	})
	if got := value("effectively_outbox_slot_creations_total"); got != 2 {
		t.Fatalf("outbox_slot_creations_total = %v after one loss, want 2", got)
	}
	if lag, ok := tryValue(reg, "effectively_outbox_slot_lag_bytes", slot); !ok || lag < 0 {
		t.Fatalf("outbox_slot_lag_bytes = %v, %v", lag, ok)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}
