package outbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestStats(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	ctx := context.Background()

	st, err := o.Stats(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Sinks) != 0 || st.Leases != (LeaseStats{Partitions: Partitions}) {
		t.Fatalf("empty outbox: %+v", st)
	}

	// Rows waiting, with no relay: their age comes from the database's clock.
	emit(t, db, o, msg("a", "a1"), msg("a", "a2"), Message{Sink: "t", Key: []byte("k"), ID: "t1"})
	if _, err := db.Exec(ctx, `UPDATE `+o.t.messages+` SET created_at = now() - interval '1 hour' WHERE msg_id = 'a1'`); err != nil {
		t.Fatal(err)
	}
	st, err = o.Stats(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Sinks) != 2 || st.Sinks[0].Sink != "s" || st.Sinks[0].Waiting != 2 || st.Sinks[1].Sink != "t" || st.Sinks[1].Waiting != 1 {
		t.Fatalf("waiting: %+v", st.Sinks)
	}
	if age := st.Sinks[0].OldestWaitingAge; age < time.Hour || age > 2*time.Hour {
		t.Fatalf("oldest waiting age %v, want about an hour", age)
	}

	// A relay publishes what it can and parks the rest; it holds the leases.
	sink := newMemSink()
	sink.refuse["a2"] = Permanent(errors.New("too large"))
	_, run := startRelay(t, db, RelayConfig{Owner: "r1", Sinks: map[string]Sink{"s": sink}})
	sink.waitFor(t, 2*time.Minute, "a1", hasIDs("a1"))
	waitRows(t, db, 2*time.Minute, 2, `SELECT count(*) FROM `+o.t.messages+` WHERE parked_at IS NOT NULL`)
	waitUntil(t, 2*time.Minute, "r1 to hold every partition", func() bool {
		st, err = o.Stats(ctx, db)
		return err == nil && st.Leases.Held == Partitions
	})
	want := []SinkStats{{Sink: "s", Parked: 1, Published: 1}, {Sink: "t", Parked: 1}}
	if len(st.Sinks) != 2 || st.Sinks[0] != want[0] || st.Sinks[1] != want[1] {
		t.Fatalf("after the relay: %+v, want %+v", st.Sinks, want)
	}
	if l := st.Leases; l.Relays != 1 || l.Expired != 0 || l.RelaysAlive != 1 {
		t.Fatalf("leases with one relay: %+v", l)
	}

	// A graceful stop releases the leases: nothing held, nothing expired.
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if st, err = o.Stats(ctx, db); err != nil {
		t.Fatal(err)
	}
	if l := st.Leases; l.Held != 0 || l.Relays != 0 || l.Expired != 0 {
		t.Fatalf("leases after a graceful stop: %+v", l)
	}

	// Leases that ran out without a release are counted as expired.
	if _, err := db.Exec(ctx, `UPDATE `+o.t.leases+` SET owner = 'gone', expires_at = now() - interval '1 second' WHERE part < 3`); err != nil {
		t.Fatal(err)
	}
	if st, err = o.Stats(ctx, db); err != nil {
		t.Fatal(err)
	}
	if l := st.Leases; l.Held != 0 || l.Expired != 3 {
		t.Fatalf("leases after a crash: %+v", l)
	}
}

func TestStatsRows(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	ctx := context.Background()
	emit(t, db, o, msg("a", "a1"), Message{Sink: "t", ID: "t1", Value: []byte{}, Headers: []Header{{Key: "h", Value: []byte("v")}}}, msg("b", "b1"))
	if _, err := db.Exec(ctx, `UPDATE `+o.t.messages+` SET parked_at = now(), park_reason = 'refused' WHERE msg_id = 'a1'`); err != nil {
		t.Fatal(err)
	}
	parked, err := o.Rows(ctx, db, RowFilter{})
	if err != nil || len(parked) != 1 || parked[0].Message.ID != "a1" || parked[0].ParkReason != "refused" || parked[0].ParkedAt.IsZero() {
		t.Fatalf("parked rows %+v, %v", parked, err)
	}
	waiting, err := o.Rows(ctx, db, RowFilter{Waiting: true})
	if err != nil || len(waiting) != 2 || waiting[0].Message.ID != "t1" || waiting[1].Message.ID != "b1" {
		t.Fatalf("waiting rows %+v, %v", waiting, err)
	}
	w := waiting[0]
	if w.Message.Key != nil || w.Message.Value == nil || len(w.Message.Headers) != 1 || w.Message.Headers[0].Key != "h" || !w.ParkedAt.IsZero() {
		t.Fatalf("t1 read back as %+v", w)
	}
	for _, c := range []struct {
		f    RowFilter
		want []string
	}{
		{RowFilter{Waiting: true, Sink: "s"}, []string{"b1"}},
		{RowFilter{Waiting: true, Limit: 1}, []string{"t1"}},
		{RowFilter{Waiting: true, IDs: []int64{parked[0].ID, w.ID}}, []string{"t1"}},
		{RowFilter{Sink: "t"}, nil},
	} {
		rs, err := o.Rows(ctx, db, c.f)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range rs {
			got = append(got, r.Message.ID)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%+v: %v, want %v", c.f, got, c.want)
		}
	}
}

// TestStatsLogTable: LogMode emits are counted in Stats.Log, rows and
// messages, with the oldest row's age.
func TestStatsLogTable(t *testing.T) {
	db, o := setup(t, Config{})
	ctx := context.Background()
	emit(t, db, o, msg("a", "a1"), msg("a", "a2"), msg("b", "b1"))
	emit(t, db, o, msg("a", "a3"))
	if _, err := db.Exec(ctx, `UPDATE `+o.t.log+` SET created_at = now() - interval '1 hour' WHERE n = 3`); err != nil {
		t.Fatal(err)
	}
	st, err := o.Stats(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if st.Log.Rows != 2 || st.Log.Messages != 4 || st.Log.OldestAge < time.Hour || st.Log.OldestAge > 2*time.Hour || len(st.Sinks) != 0 {
		t.Fatalf("stats %+v; want 4 messages in 2 log rows, the oldest an hour old, none in the messages table", st)
	}
}
