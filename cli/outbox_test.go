package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/cli"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
)

// listSink is an outbox.Sink that keeps what it publishes and refuses for
// good the message IDs in refuse; the later messages of a refused one's key
// in the same call fail with it, so the key's order holds.
type listSink struct {
	mu     sync.Mutex
	got    []string
	refuse map[string]bool
}

func (s *listSink) Publish(ctx context.Context, msgs []outbox.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	errs := outbox.PublishErrors{}
	failed := map[string]bool{}
	for i, m := range msgs {
		switch {
		case failed[string(m.Key)]:
			errs[i] = errors.New("behind a refusal of its key")
		case s.refuse[m.ID]:
			errs[i] = outbox.Permanent(fmt.Errorf("message %s too large", m.ID))
			failed[string(m.Key)] = true
		default:
			s.got = append(s.got, m.ID)
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

func (s *listSink) published() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

func (s *listSink) allow(id string) {
	s.mu.Lock()
	delete(s.refuse, id)
	s.mu.Unlock()
}

// newOutbox migrates an outbox in the test's database.
func (e *env) newOutbox(schema, table string) *outbox.Outbox {
	e.t.Helper()
	o, err := outbox.New(outbox.Config{Schema: schema, Table: table, Mode: outbox.TableMode})
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := pg.Migrate(context.Background(), e.pool, schema, o.Line()); err != nil {
		e.t.Fatal(err)
	}
	return o
}

func (e *env) emit(o *outbox.Outbox, msgs ...outbox.Message) {
	e.t.Helper()
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return o.Emit(ctx, tx, msgs...) }); err != nil {
		e.t.Fatal(err)
	}
}

// relayUntil runs a relay over the sinks until done reports true of the
// outbox's stats, then stops it gracefully. The wait is a guard against a
// hung test, not a timing assertion.
func (e *env) relayUntil(o *outbox.Outbox, sinks map[string]outbox.Sink, what string, done func(outbox.Stats) bool) {
	e.t.Helper()
	r, err := outbox.NewRelay(e.pool, outbox.RelayConfig{Sinks: sinks, LeaseTTL: 2 * time.Second, PollInterval: 50 * time.Millisecond,
		MinBackoff: time.Millisecond, MaxBackoff: 10 * time.Millisecond, Logger: consumertest.Logger()})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- r.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := o.Stats(context.Background(), e.pool)
		if err != nil {
			e.t.Fatal(err)
		}
		if done(st) {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-stopped
			e.t.Fatalf("waiting for %s: %+v", what, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-stopped; err != nil {
		e.t.Fatal(err)
	}
}

func sinkStats(st outbox.Stats, sink string) outbox.SinkStats {
	for _, s := range st.Sinks {
		if s.Sink == sink {
			return s
		}
	}
	return outbox.SinkStats{Sink: sink}
}

func outboxStats(e *env, args ...string) cli.OutboxStats {
	e.t.Helper()
	r := e.must(cli.Options{}, append(args, "--json")...)
	var st cli.OutboxStats
	if err := json.Unmarshal([]byte(r.out), &st); err != nil {
		e.t.Fatalf("%v in %s", err, r.out)
	}
	return st
}

func outboxList(e *env, args ...string) []cli.OutboxMessage {
	e.t.Helper()
	r := e.must(cli.Options{}, append(append([]string{"outbox", "list"}, args...), "--json")...)
	var ms []cli.OutboxMessage
	if err := json.Unmarshal([]byte(r.out), &ms); err != nil {
		e.t.Fatalf("%v in %s", err, r.out)
	}
	return ms
}

func messageIDs(ms []cli.OutboxMessage) string {
	var ids []string
	for _, m := range ms {
		ids = append(ids, m.MessageID)
	}
	return strings.Join(ids, ",")
}

// A sink refuses a message and the relay parks it; a message to a sink no
// relay knows is parked too. stats counts them, list shows them, purge
// releases a sink's, and redrive puts one back in line, after which its
// key's held-back message goes out behind it.
func TestOutboxCommands(t *testing.T) {
	e := newEnv(t)
	o := e.newOutbox(outbox.DefaultSchema, outbox.DefaultTable)
	sink := &listSink{refuse: map[string]bool{"big": true}}
	e.emit(o,
		outbox.Message{Sink: "orders", Key: []byte("k1"), ID: "m1", Value: []byte("1")},
		outbox.Message{Sink: "orders", Key: []byte("k1"), ID: "big", Value: []byte("2"), Headers: []outbox.Header{{Key: "h", Value: []byte{0xff}}}},
		outbox.Message{Sink: "orders", Key: []byte("k1"), ID: "m3", Value: []byte("3")},
		outbox.Message{Sink: "orders", Key: []byte("k2"), ID: "m4", Value: []byte{}},
		outbox.Message{Sink: "gone", ID: "g1"},
		outbox.Message{Sink: "gone", Key: []byte("kg"), ID: "g2", Value: []byte("x")},
	)
	// Before any relay: everything waits.
	st := outboxStats(e, "outbox", "stats")
	if len(st.Sinks) != 2 || st.Sinks[0].Sink != "gone" || st.Sinks[0].Waiting != 2 || st.Sinks[1].Waiting != 4 ||
		st.Leases.Partitions != outbox.Partitions || st.Leases.Held != 0 {
		t.Fatalf("stats before the relay: %+v", st)
	}
	if got := messageIDs(outboxList(e, "--waiting", "--sink", "orders")); got != "m1,big,m3,m4" {
		t.Fatalf("waiting orders: %s", got)
	}

	e.relayUntil(o, map[string]outbox.Sink{"orders": sink}, "three parked, two published", func(st outbox.Stats) bool {
		return sinkStats(st, "orders").Parked == 1 && sinkStats(st, "gone").Parked == 2 && sinkStats(st, "orders").Published == 2
	})
	st = outboxStats(e, "outbox", "stats")
	want := []cli.OutboxSinkStats{{Sink: "gone", Parked: 2}, {Sink: "orders", Waiting: 1, Parked: 1, Published: 2}}
	if len(st.Sinks) != 2 || st.Sinks[1].OldestWaitingSeconds <= 0 {
		t.Fatalf("stats after the relay: %+v", st)
	}
	st.Sinks[1].OldestWaitingSeconds = 0
	if fmt.Sprint(st.Sinks) != fmt.Sprint(want) || st.Leases.Held != 0 || st.Leases.Expired != 0 {
		t.Fatalf("stats after the relay: %+v, want sinks %+v and no lease held", st, want)
	}
	r := e.must(cli.Options{}, "outbox", "stats")
	if !strings.Contains(r.out, "SINK") || !regexpMatch(`orders\s+1\s+\S+\s+1\s+2`, r.out) ||
		!strings.Contains(r.out, "leases: 0 of 64 partitions held by 0 relay(s), 0 expired") {
		t.Fatalf("stats table:\n%s", r.out)
	}

	// list: the parked ones, oldest first, with their reasons.
	parked := outboxList(e)
	if messageIDs(parked) != "big,g1,g2" {
		t.Fatalf("parked: %s", messageIDs(parked))
	}
	b := parked[0]
	if b.Sink != "orders" || b.Key != "k1" || b.Value != "2" || b.Reason != "message big too large" || b.ParkedAt == nil ||
		len(b.Headers) != 1 || b.Headers[0].Key != "h" || !b.Headers[0].ValueBase64 {
		t.Fatalf("big listed as %+v", b)
	}
	if g := parked[1]; !g.KeyNull || !g.ValueNull || !strings.Contains(g.Reason, `"gone"`) {
		t.Fatalf("g1 listed as %+v", g)
	}
	if got := messageIDs(outboxList(e, "--sink", "gone", "--limit", "1")); got != "g1" {
		t.Fatalf("--sink gone --limit 1: %s", got)
	}
	if got := messageIDs(outboxList(e, "--waiting")); got != "m3" {
		t.Fatalf("waiting after the relay: %s (m3 is held back behind big)", got)
	}
	r = e.must(cli.Options{}, "outbox", "list")
	if !strings.Contains(r.out, "REASON") || !strings.Contains(r.out, "message big too large") || !strings.Contains(r.out, "(null)") {
		t.Fatalf("list table:\n%s", r.out)
	}

	// Refusals: no selection, an ID that is not parked, no terminal, a "no".
	refusals := []struct {
		opts  cli.Options
		stdin string
		args  []string
		want  string
	}{
		{cli.Options{}, "", []string{"outbox", "purge"}, "no selection"},
		{cli.Options{}, "", []string{"outbox", "redrive", "--all", "--sink", "gone"}, "--all selects every parked message"},
		{cli.Options{}, "", []string{"outbox", "redrive", "--id", fmt.Sprint(parked[0].ID + 1000), "--yes"}, "no parked message with id"},
		{cli.Options{}, "", []string{"outbox", "purge", "--id", fmt.Sprint(b.ID), "--sink", "gone", "--yes"}, "of sink gone"},
		{cli.Options{}, "", []string{"outbox", "purge", "--sink", "gone"}, "refusing to write without confirmation"},
		{cli.Options{AssumeTerminal: true}, "n\n", []string{"outbox", "redrive", "--all"}, "aborted"},
		{cli.Options{}, "", []string{"outbox", "stats", "--outbox-table", strings.Repeat("x", 60)}, "--outbox-table"},
	}
	for _, c := range refusals {
		_, err := e.run(c.opts, c.stdin, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", strings.Join(c.args, " "), err, c.want)
		}
	}
	if got := messageIDs(outboxList(e)); got != "big,g1,g2" {
		t.Fatalf("a refused command changed the parked rows: %s", got)
	}

	// purge --sink: that sink's parked rows go, the others stay.
	r, err := e.run(cli.Options{AssumeTerminal: true}, "y\n", "outbox", "purge", "--sink", "gone")
	if err != nil || !strings.Contains(r.out, "purged 2 parked outbox message(s)") || !strings.Contains(r.err, "Delete 2 parked outbox message(s) for good?") {
		t.Fatalf("purge --sink gone: %v\n%s%s", err, r.out, r.err)
	}
	if got := messageIDs(outboxList(e)); got != "big" {
		t.Fatalf("parked after the purge: %s", got)
	}
	r = e.must(cli.Options{}, "outbox", "purge", "--sink", "gone", "--yes")
	if !strings.Contains(r.out, "no parked outbox message matches") {
		t.Fatalf("purge of nothing: %s", r.out)
	}

	// redrive --id: big goes back in line and, once the sink takes it, m3
	// follows it in order.
	sink.allow("big")
	r = e.must(cli.Options{}, "outbox", "redrive", "--id", fmt.Sprint(b.ID), "--yes")
	if !strings.Contains(r.out, "redrove 1 parked outbox message(s)") {
		t.Fatalf("redrive: %s", r.out)
	}
	if got := messageIDs(outboxList(e, "--waiting")); got != "big,m3" {
		t.Fatalf("waiting after the redrive: %s", got)
	}
	e.relayUntil(o, map[string]outbox.Sink{"orders": sink}, "big and m3 published", func(st outbox.Stats) bool {
		return sinkStats(st, "orders").Published == 4
	})
	if got := strings.Join(sink.published(), ","); !strings.HasSuffix(got, "big,m3") || len(sink.published()) != 4 {
		t.Fatalf("published %s, want big then m3 last", got)
	}
	st = outboxStats(e, "outbox", "stats")
	if len(st.Sinks) != 1 || st.Sinks[0] != (cli.OutboxSinkStats{Sink: "orders", Published: 4}) {
		t.Fatalf("stats at the end: %+v", st.Sinks)
	}
}

// --schema and --outbox-table name the outbox's tables.
func TestOutboxTableFlags(t *testing.T) {
	e := newEnv(t)
	o := e.newOutbox("ops", "orders_outbox")
	e.emit(o, outbox.Message{Sink: "s", Key: []byte("k"), ID: "a"})
	st := outboxStats(e, "--schema", "ops", "outbox", "stats", "--outbox-table", "orders_outbox")
	if st.Table != "ops.orders_outbox" || len(st.Sinks) != 1 || st.Sinks[0].Waiting != 1 {
		t.Fatalf("stats of ops.orders_outbox: %+v", st)
	}
	if got := messageIDs(outboxList(e, "--waiting", "--outbox-table", "orders_outbox", "--schema", "ops")); got != "a" {
		t.Fatalf("waiting in ops.orders_outbox: %s", got)
	}
	if _, err := e.run(cli.Options{}, "", "outbox", "stats"); err == nil || !strings.Contains(err.Error(), "outbox") {
		t.Fatalf("stats of the missing default outbox: %v", err)
	}
}

func regexpMatch(re, s string) bool { return regexp.MustCompile(re).MatchString(s) }
