package consumer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
)

// scriptSource delivers the batches it is given, in order, each once, and
// records what was acknowledged. Its messages keep the Source, Lane and Ref
// they were given, so tests can deliver refs the test broker never makes
// (binary, recurring).
type scriptSource struct {
	mu      sync.Mutex
	batches []*consumer.Batch
	next    int
	wake    chan struct{}
	acked   int
	settled int
}

var _ consumer.Source = (*scriptSource)(nil)

func newScript(batches ...[]consumer.Message) *scriptSource {
	s := &scriptSource{wake: make(chan struct{})}
	for i, msgs := range batches {
		b := &consumer.Batch{Lane: fmt.Sprintf("script-%d", i)}
		for _, m := range msgs {
			if m.Source == "" {
				m.Source = "script"
			}
			m.Lane = b.Lane
			m.Attempt = 1
			b.Messages = append(b.Messages, &m)
		}
		s.batches = append(s.batches, b)
	}
	return s
}

func (s *scriptSource) Fetch(ctx context.Context, _ int) (*consumer.Batch, error) {
	for {
		s.mu.Lock()
		// One batch at a time, so batches commit in order.
		if s.next < len(s.batches) && s.settled == s.next {
			b := s.batches[s.next]
			s.next++
			s.mu.Unlock()
			return b, nil
		}
		wake := s.wake
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-wake:
		}
	}
}

func (s *scriptSource) Settle(_ context.Context, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settled++
	s.acked += len(ack)
	close(s.wake)
	s.wake = make(chan struct{})
	return nil
}

// waitSettled blocks until every batch was settled, or fails t.
func (s *scriptSource) waitSettled(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		s.mu.Lock()
		done := s.settled == len(s.batches)
		wake := s.wake
		s.mu.Unlock()
		if done {
			return
		}
		select {
		case <-wake:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("batches not settled within %s", timeout)
		}
	}
}

// runScript runs a consumer over the script until every batch is settled.
func (e *env) runScript(s *scriptSource, cfg consumer.Config) {
	e.t.Helper()
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 1
	}
	c := consumertest.NewConsumer(e.t, e.pool, s, e.config(cfg))
	r := consumertest.Start(c)
	s.waitSettled(e.t, 30*time.Second)
	r.Stop(e.t)
}

// redriven is what a redrive handler saw of one message.
type redriven struct {
	ref, source, lane string
	key, value        []byte
	keyNil, valueNil  bool
	headers           []consumer.Header
}

// redriveAll redrives every parked row of scope "test" with a KeyFunc that
// takes the payload as the ID (so key-less rows can be redriven too), and
// returns what the handler saw, in row order.
func (e *env) redriveAll() ([]redriven, parked.RedriveResult) {
	e.t.Helper()
	var mu sync.Mutex
	var seen []redriven
	cfg := e.redriveConfig(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, redriven{ref: m.Ref, source: m.Source, lane: m.Lane, key: m.Key, value: m.Value,
			keyNil: m.Key == nil, valueNil: m.Value == nil, headers: m.Headers})
		return nil
	})
	cfg.KeyFunc = func(m *consumer.Message) (dedupe.Key, error) {
		// Every part of the message in the ID: each row is its own message.
		sum := sha256.Sum256(fmt.Appendf(nil, "%q|%q|%#v|%#v|%#v", m.Source, m.Ref, m.Value, m.Key, m.Headers))
		return dedupe.Key{ID: fmt.Sprintf("%x", sum)}, nil
	}
	res, err := cfg.run(e)
	if err != nil {
		e.t.Fatal(err)
	}
	return seen, res
}

// Key-less messages are parked with reason invalid_key, without a marker.
func keyless(ref, payload string) consumer.Message {
	return consumer.Message{Ref: ref, Value: []byte(payload)}
}

// Refs that differ only in bytes that are not valid UTF-8, or in a NUL,
// are different messages: each is parked, and redriven with its ref exact.
func TestParkedBinaryRefsKeptApart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{})
	refs := []string{"r\xff", "r\xfe", "r\x00", "r\uFFFD", "r"}
	var msgs []consumer.Message
	for i, ref := range refs {
		msgs = append(msgs, keyless(ref, fmt.Sprint("payload-", i)))
	}
	s := newScript(msgs)
	e.runScript(s, consumer.Config{})
	if got := e.parked(); len(got) != len(refs) {
		t.Fatalf("%d rows parked for %d messages with distinct refs: %v", len(got), len(refs), got)
	}
	seen, res := e.redriveAll()
	if res.Applied != len(refs) {
		t.Fatalf("redrive: %+v", res)
	}
	for i, r := range seen {
		if r.ref != refs[i] || string(r.value) != fmt.Sprint("payload-", i) {
			t.Errorf("row %d redriven with ref %q payload %q, want %q %q", i, r.ref, r.value, refs[i], fmt.Sprint("payload-", i))
		}
	}
}

// A ref that recurs (a topic deleted and created again starts its offsets
// at 0 again; a user-written source) with another message under it: both
// are parked.
func TestParkedRecurringRefKeepsBoth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{})
	perm := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return consumer.Permanent(errors.New("poison " + string(m.Value)))
	}
	s := newScript(
		[]consumer.Message{keyless("orders/0@0", "first"), {ID: "a", Ref: "orders/0@1", Value: []byte("a")}},
		[]consumer.Message{keyless("orders/0@0", "second"), {ID: "b", Ref: "orders/0@1", Value: []byte("b")}},
	)
	e.runScript(s, consumer.Config{Handler: perm})
	got := e.parked()
	if len(got) != 4 {
		t.Fatalf("%d rows parked, want 4 (two messages under each of two refs): %v", len(got), got)
	}
	payloads := map[string]bool{}
	for _, p := range got {
		payloads[string(p.Payload)] = true
	}
	for _, want := range []string{"first", "second", "a", "b"} {
		if !payloads[want] {
			t.Errorf("message %q was not parked: %v", want, got)
		}
	}
}

// The same message parked again (same scope, source, ref and content) is
// one row whose count says how often; a message under the same ref with
// other content (nil, empty or other payload; another key; other headers)
// is a row of its own.
func TestParkedSameMessageCounted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{})
	const ref = "lane@7"
	same := keyless(ref, "x")
	variants := []consumer.Message{
		{Ref: ref, Value: nil},
		{Ref: ref, Value: []byte{}},
		{Ref: ref, Value: []byte("x"), Key: []byte{}},
		{Ref: ref, Value: []byte("x"), Key: []byte("k")},
		{Ref: ref, Value: []byte("x"), Headers: []consumer.Header{{Key: "h", Value: nil}}},
		{Ref: ref, Value: []byte("x"), Headers: []consumer.Header{{Key: "h", Value: []byte{}}}},
		{Ref: ref, Value: []byte("x"), Source: "other"},
	}
	// The first batch holds the same delivery twice, as a broker that
	// duplicates within a batch does; a later batch holds it once more.
	first := append([]consumer.Message{same, same}, variants...)
	s := newScript(first, []consumer.Message{same})
	e.runScript(s, consumer.Config{})
	if s.acked != len(first)+1 {
		t.Fatalf("%d messages acknowledged, want %d", s.acked, len(first)+1)
	}
	rows := e.parkCounts()
	if len(rows) != 1+len(variants) {
		t.Fatalf("%d rows, want %d: %v", len(rows), 1+len(variants), rows)
	}
	if rows[0] != 3 {
		t.Errorf("the message parked three times has count %d, want 3", rows[0])
	}
	for i, n := range rows[1:] {
		if n != 1 {
			t.Errorf("variant %d has count %d, want 1", i, n)
		}
	}
	seen, res := e.redriveAll()
	if res.Applied != 1+len(variants) || len(seen) != 1+len(variants) {
		t.Fatalf("redrive: %+v", res)
	}
	want := append([]consumer.Message{same}, variants...)
	for i, r := range seen {
		w := want[i]
		wsrc := w.Source
		if wsrc == "" {
			wsrc = "script"
		}
		if r.ref != ref || r.source != wsrc || r.valueNil != (w.Value == nil) || !bytes.Equal(r.value, w.Value) ||
			r.keyNil != (w.Key == nil) || !bytes.Equal(r.key, w.Key) || len(r.headers) != len(w.Headers) {
			t.Errorf("row %d redriven as %+v, want %+v", i, r, w)
			continue
		}
		for j, h := range w.Headers {
			if g := r.headers[j]; g.Key != h.Key || (g.Value == nil) != (h.Value == nil) || !bytes.Equal(g.Value, h.Value) {
				t.Errorf("row %d header %d redriven as %#v, want %#v", i, j, g, h)
			}
		}
	}
}

// parkCounts returns the park count of each parked row, in row order.
func (e *env) parkCounts() []int {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT park_count FROM effectively.parked ORDER BY id`)
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// Under a broker that delivers messages twice, also within one batch, and
// loses acknowledgements, every parked delivery is counted on its row:
// one row per message, and the counts add up to the deliveries.
func TestParkedDeliveriesCounted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 2, DuplicateRate: 0.5, LostAckRate: 0.3, Seed: 3})
	const n = 200
	for i := range n {
		e.broker.Publish(i, consumer.Message{Value: []byte(fmt.Sprint("keyless-", i))})
	}
	e.runUntilIdle(e.consumer(consumer.Config{BatchSize: 25}), 30*time.Second)
	tot := e.hooks.Total()
	if tot.Failed != 0 {
		t.Fatalf("%d batches failed: %s", tot.Failed, tot)
	}
	counts := e.parkCounts()
	sum := 0
	for _, c := range counts {
		sum += c
	}
	delivered := e.broker.Stats().Delivered
	if len(counts) != n || sum != delivered || sum != tot.Parked || e.broker.Stats().LostAcks == 0 {
		t.Fatalf("%d rows with counts summing to %d; want %d rows, %d deliveries (%d reported parked; broker %+v)",
			len(counts), sum, n, delivered, tot.Parked, e.broker.Stats())
	}
}

// A message parked again under another key decision keeps one row, and the
// row keeps what a redrive needs to apply it once: parked first with its
// key and a marker, then again without a key (a KeyFunc that now fails),
// the row keeps the key and the marker, so a redrive applies it instead of
// claiming the key, finding the row's own marker and dropping it as a
// duplicate. The other way round, the row takes the key and the marker.
func TestParkedAgainKeepsKeyAndMarker(t *testing.T) {
	t.Parallel()
	for _, keyedFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("keyed-first=%v", keyedFirst), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, consumertest.Config{})
			m := consumer.Message{Ref: "orders/0@5", Value: []byte("poison")}
			keyed := consumer.Config{
				KeyFunc: func(m *consumer.Message) (dedupe.Key, error) { return dedupe.Key{ID: "k-5"}, nil },
				Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					return consumer.Permanent(errors.New("poison"))
				},
			}
			keyless := consumer.Config{
				KeyFunc: func(m *consumer.Message) (dedupe.Key, error) { return dedupe.Key{}, errors.New("no key today") },
			}
			order := []consumer.Config{keyed, keyless}
			if !keyedFirst {
				order = []consumer.Config{keyless, keyed}
			}
			for _, cfg := range order {
				e.runScript(newScript([]consumer.Message{m}), cfg)
			}
			var n, count int
			var id *string
			var marker bool
			if err := e.pool.QueryRow(context.Background(), `SELECT count(*) OVER (), park_count, dedupe_id, has_marker FROM effectively.parked`).Scan(&n, &count, &id, &marker); err != nil {
				t.Fatal(err)
			}
			if n != 1 || count != 2 || id == nil || *id != "k-5" || !marker {
				t.Fatalf("%d rows, count %d, dedupe_id %v, has_marker %v; want 1 row, 2, k-5, true", n, count, id, marker)
			}
			cfg := e.redriveConfig(insertEffect)
			cfg.KeyFunc = keyed.KeyFunc
			res, err := cfg.run(e)
			if err != nil || res.Applied != 1 {
				t.Fatalf("redrive: %+v, %v", res, err)
			}
		})
	}
}
