package outbox

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestSlots: the slots' status comes from the server, so it tells what an
// operator must know whether a relay runs or not: a slot read and caught
// up is healthy; one no relay reads, or behind by more than allowed, or
// gone, is reported with what will happen.
func TestSlots(t *testing.T) {
	db, o := setup(t, Config{})
	ctx := context.Background()
	if got, err := o.Slots(ctx, db); err != nil || len(got) != 0 {
		t.Fatalf("before any log relay: %+v, %v; want no slot", got, err)
	}
	sink := newMemSink()
	r, run := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}})
	waitActive(t, r)
	emit(t, db, o, msg("k", "a"), msg("k", "b"))
	sink.waitFor(t, time.Minute, "both messages", hasIDs("a", "b"))

	one := func() SlotStatus {
		t.Helper()
		got, err := o.Slots(ctx, db)
		if err != nil || len(got) != 1 {
			t.Fatalf("slots: %+v, %v; want one", got, err)
		}
		return got[0]
	}
	s := one()
	if s.Slot != r.Stats().Slot || !s.Exists || !s.Ready || !s.Active || s.WALStatus != "reserved" || s.SafeWALBytes != -1 || s.LagBytes < 0 {
		t.Fatalf("a slot read by a relay: %+v", s)
	}
	if p := s.Problems(SlotProblems{}); len(p) != 0 {
		t.Fatalf("a slot read by a relay has problems: %v", p)
	}
	if p := s.Problems(SlotProblems{MaxLagBytes: 1}); s.LagBytes > 1 && (len(p) != 1 || !strings.Contains(p[0], "bytes behind")) {
		t.Fatalf("a slot %d bytes behind, 1 allowed: %v", s.LagBytes, p)
	}

	// No relay reads it: a problem, unless allowed; the lag grows with
	// what is written meanwhile, and nothing is confirmed.
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "the slot released", func() bool { return !one().Active })
	emit(t, db, o, msg("k", "c"))
	s = one()
	if p := s.Problems(SlotProblems{}); len(p) != 1 || !strings.Contains(p[0], "no relay reads the slot") {
		t.Fatalf("a slot no relay reads: %+v, problems %v", s, p)
	}
	if p := s.Problems(SlotProblems{AllowInactive: true}); len(p) != 0 {
		t.Fatalf("an inactive slot, allowed: %v", p)
	}
	if s.LagBytes <= 0 || s.RetainedBytes < s.LagBytes {
		t.Fatalf("a slot behind a commit it was not sent: %+v", s)
	}

	// Gone: reported with what the next relay does.
	if _, err := db.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, s.Slot); err != nil {
		t.Fatal(err)
	}
	s = one()
	if p := s.Problems(SlotProblems{}); s.Exists || len(p) != 1 || !strings.Contains(p[0], "the slot is gone") {
		t.Fatalf("a dropped slot: %+v, problems %v", s, p)
	}
}
