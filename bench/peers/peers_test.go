package peers

import (
	"bytes"
	"context"
	"hash/adler32"
	"os"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	MaybeWorker() // the consumers run in copies of the test binary
	os.Exit(m.Run())
}

// TestTable runs every system at a tiny size, so that the command keeps
// working, and checks what each must leave in the ledger: this library
// exactly one effect per logical message, and the peers the faults the
// table exists to show, as far as they are certain (a crash after the
// commit of a record always redelivers at least that record).
func TestTable(t *testing.T) {
	w := Workload{Messages: 300, DupEvery: 10, DupLag: 20}
	var log bytes.Buffer
	rep, err := Run(context.Background(), Options{
		Messages: w.Messages, PeerMessages: w.Messages, CrashMessages: w.Messages,
		DupEvery: w.DupEvery, DupLag: w.DupLag, Runs: 1,
		SessionTimeout: 3 * time.Second, WorkerTimeout: 3 * time.Minute, Log: &log,
	})
	t.Log("\n" + log.String())
	if err != nil {
		t.Fatal(err)
	}
	copies := w.Records() - w.Messages
	hashes := map[uint32]bool{}
	for i := range w.Messages {
		_, payload := logical(i)
		hashes[adler32.Checksum(payload)] = true
	}
	adlerLost := w.Messages - len(hashes)
	if adlerLost == 0 {
		t.Fatal("the workload's payloads have no Adler-32 collision; the as-shipped Watermill row would show nothing")
	}

	// What each peer must show. Only what is certain is checked exactly: a
	// consumer group member the coordinator drops (a heartbeat missed on a
	// loaded machine) has its records redelivered, which may add double
	// effects to the peers, never to this library.
	type bound struct{ lo, hi int } // hi < 0: no upper bound
	type want struct{ double, lost, crashDouble, crashLost bound }
	exactly := func(n int) bound { return bound{n, n} }
	atLeast := func(n int) bound { return bound{n, -1} }
	wants := map[string]want{
		// A message whose payload has the checksum of one seen before is
		// dropped; after the crash a fresh process has forgotten them all.
		"Watermill + Deduplicator, as shipped (Adler-32)": {atLeast(0), exactly(adlerLost), atLeast(0), bound{0, adlerLost}},
		// The record committed before the crash is delivered again to a
		// process whose Deduplicator never saw it.
		"Watermill + Deduplicator, SHA-256": {atLeast(0), exactly(0), atLeast(1), exactly(0)},
		// Every copy is applied, and so is the record committed before the
		// crash, again.
		"kafka-go + pgx, a transaction per message":                      {atLeast(copies), exactly(0), atLeast(copies + 1), exactly(0)},
		"kafka-go + pgx, a transaction per message, processed-ids check": {exactly(0), exactly(0), exactly(0), exactly(0)},
		// The batch committed before the crash is delivered again and
		// dropped by processed_ids.
		FranzGoPeer: {exactly(0), exactly(0), exactly(0), exactly(0)},
	}
	if len(rep.Results) != len(Shapes)+1+len(wants) { // the shapes, and one on sources/franz
		t.Fatalf("%d results, want %d", len(rep.Results), len(Shapes)+1+len(wants))
	}
	check := func(system, what string, got int, b bound) {
		if got < b.lo || (b.hi >= 0 && got > b.hi) {
			t.Errorf("%s: %d %s, want %v", system, got, what, b)
		}
	}
	for _, r := range rep.Results {
		name := r.System.Name
		if r.Rate <= 0 {
			t.Errorf("%s: rate %v", name, r.Rate)
		}
		wt, ok := wants[name]
		if r.System.Library {
			wt, ok = want{exactly(0), exactly(0), exactly(0), exactly(0)}, true
		}
		if !ok {
			t.Errorf("unexpected system %q", name)
			continue
		}
		check(name, "double effects without a crash", r.NoCrash.Double, wt.double)
		check(name, "lost effects without a crash", r.NoCrash.Lost, wt.lost)
		check(name, "double effects after the crash", r.Crash.Double, wt.crashDouble)
		check(name, "lost effects after the crash", r.Crash.Lost, wt.crashLost)
	}

	var out strings.Builder
	rep.Table(&out)
	t.Log("\n" + out.String())
	for _, r := range rep.Results {
		if !strings.Contains(out.String(), "| "+r.System.Name+" |") {
			t.Errorf("the table has no row for %s", r.System.Name)
		}
	}
}

// TestWorkloadOrder checks the produced sequence: every message once, every
// DupEvery-th a second time, DupLag messages after its original.
func TestWorkloadOrder(t *testing.T) {
	w := Workload{Messages: 1000, DupEvery: 20, DupLag: 100}
	order := w.order()
	if len(order) != w.Records() || w.Records() != 1050 {
		t.Fatalf("%d records, Records() %d, want 1050", len(order), w.Records())
	}
	first := map[int]int{}
	for at, i := range order {
		f, seen := first[i]
		switch {
		case !seen:
			first[i] = at
		case i%w.DupEvery != 0:
			t.Errorf("message %d produced twice", i)
		case i+w.DupLag < w.Messages && order[at-1] != i+w.DupLag:
			t.Errorf("the copy of message %d at %d follows message %d, want %d", i, at, order[at-1], i+w.DupLag)
		case at <= f:
			t.Errorf("the copy of message %d comes before it", i)
		}
	}
	if len(first) != w.Messages {
		t.Errorf("%d distinct messages, want %d", len(first), w.Messages)
	}
}
