package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/cli"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/outbox"
)

// "outbox health" checks the log relay's slot as the server sees it: fine
// while a relay reads it, a problem (and a non-zero exit) once none does,
// unless that is allowed; "outbox stats" shows the same slots.
func TestOutboxHealth(t *testing.T) {
	e := newEnv(t)
	o := e.newOutbox("", "")
	if r := e.must(cli.Options{}, "outbox", "health"); !strings.Contains(r.out, "no log relay slot") {
		t.Fatalf("no slot yet: %q", r.out)
	}
	sink := &listSink{refuse: map[string]bool{}}
	r, err := outbox.NewLogRelay(e.pool, outbox.LogRelayConfig{Sinks: map[string]outbox.Sink{"s": sink},
		StatusInterval: 50 * time.Millisecond, Logger: consumertest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-stopped })
	deadline := time.Now().Add(time.Minute)
	for !r.Stats().Active {
		if time.Now().After(deadline) {
			t.Fatal("the log relay did not read its slot")
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.emit(o, outbox.Message{Sink: "s", Key: []byte("k"), ID: "a", Value: []byte("v")})

	health := func(args ...string) ([]cli.OutboxSlot, error) {
		t.Helper()
		res, err := e.run(cli.Options{}, "", append([]string{"outbox", "health", "--json"}, args...)...)
		var slots []cli.OutboxSlot
		if jerr := json.Unmarshal([]byte(res.out), &slots); jerr != nil {
			t.Fatalf("%v in %q (stderr %q)", jerr, res.out, res.err)
		}
		return slots, err
	}
	slots, err := health()
	if err != nil || len(slots) != 1 || !slots[0].Active || !slots[0].Exists || len(slots[0].Problems) != 0 || slots[0].Slot != r.Stats().Slot {
		t.Fatalf("a slot read by a relay: %+v, %v", slots, err)
	}
	if st := outboxStats(e, "outbox", "stats"); len(st.Slots) != 1 || st.Slots[0].Slot != slots[0].Slot {
		t.Fatalf("outbox stats shows slots %+v", st.Slots)
	}

	cancel()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	stopped <- nil // for the cleanup
	deadline = time.Now().Add(time.Minute)
	for {
		slots, err = health()
		if err != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err == nil || len(slots) != 1 || len(slots[0].Problems) != 1 || !strings.Contains(slots[0].Problems[0], "no relay reads the slot") {
		t.Fatalf("a slot no relay reads: %+v, %v", slots, err)
	}
	res, err := e.run(cli.Options{}, "", "outbox", "health")
	if err == nil || !strings.Contains(res.out, "PROBLEM slot "+slots[0].Slot) || !strings.Contains(res.out, "no relay reads the slot") {
		t.Fatalf("outbox health with no relay: %v\n%s", err, res.out)
	}
	if _, err := health("--allow-inactive"); err != nil {
		t.Fatalf("an inactive slot, allowed: %v", err)
	}
}
