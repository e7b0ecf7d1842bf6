package sourcetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
)

// fetchGuard bounds one wait for a delivery: a guard against a hung test,
// not a performance assertion.
const fetchGuard = 30 * time.Second

// published is what the suite sent as one message.
type published struct {
	lane, idx int
	msg       Message
}

// env is one subtest's broker, its current source, and what the subtest
// has published and seen. Its methods are safe for concurrent use.
type env struct {
	*testing.T
	h Harness
	b *Broker

	mu      sync.Mutex
	src     consumer.Source
	gen     int // bumped by restart: batches of older sources are stale
	sent    map[string]published
	count   map[int]int            // publish lane → messages published to it
	refOf   map[string]string      // tag → Ref
	tagOf   map[string]string      // Ref → tag
	out     map[string]bool        // lanes with a batch in flight from src
	laneOf  map[int]string         // publish lane → Lane, for src (ordered sources)
	pubOf   map[string]int         // Lane → publish lane, for src
	first   map[int]int            // publish lane → index of its latest first delivery
	seen    map[string]int         // tag → deliveries
	lastMsg map[string]consumerMsg // tag → its latest delivery
	acked   map[string]bool        // tags acknowledged by a Settle that returned nil
}

// consumerMsg is a copy of the fields of a delivery the checks compare.
type consumerMsg struct {
	ref, id string
	attempt int
}

func newEnv(t *testing.T, h Harness, b *Broker) *env {
	e := &env{
		T: t, h: h, b: b,
		sent: map[string]published{}, count: map[int]int{}, refOf: map[string]string{}, tagOf: map[string]string{},
		first: map[int]int{}, seen: map[string]int{}, lastMsg: map[string]consumerMsg{}, acked: map[string]bool{},
	}
	e.resetSource()
	e.src = e.open()
	return e
}

func (e *env) resetSource() {
	e.out = map[string]bool{}
	e.laneOf = map[int]string{}
	e.pubOf = map[string]int{}
}

// open makes a source and registers its Close for the end of the test.
func (e *env) open() consumer.Source {
	e.Helper()
	src := e.b.Open(e.T)
	if src == nil {
		e.Fatal("sourcetest: Broker.Open returned nil")
	}
	if c, ok := src.(io.Closer); ok {
		e.Cleanup(func() { _ = c.Close() })
	}
	return src
}

// restart closes the current source without settling what it has in
// flight, as a crash would, and opens a new one. It returns the old one.
func (e *env) restart() consumer.Source {
	e.Helper()
	e.mu.Lock()
	old := e.src
	e.mu.Unlock()
	if c, ok := old.(io.Closer); ok {
		if err := c.Close(); err != nil {
			e.Logf("closing the old source: %v", err)
		}
	}
	src := e.open()
	e.mu.Lock()
	e.src = src
	e.gen++
	e.resetSource()
	e.mu.Unlock()
	return old
}

func (e *env) source() consumer.Source {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.src
}

// publish sends values to lane, tagged; it returns the tags in order.
func (e *env) publish(lane int, values ...[]byte) []string {
	e.Helper()
	msgs := make([]Message, len(values))
	tags := make([]string, len(values))
	e.mu.Lock()
	for i, v := range values {
		idx := e.count[lane]
		e.count[lane]++
		tags[i] = fmt.Sprintf("t%d-%d", lane, idx)
		msgs[i] = Message{Value: v, Headers: []consumer.Header{{Key: TagHeader, Value: []byte(tags[i])}}}
		e.sent[tags[i]] = published{lane: lane, idx: idx, msg: msgs[i]}
	}
	e.mu.Unlock()
	e.b.Publish(e.T, lane, msgs...)
	return tags
}

// publishN sends n text messages to lane.
func (e *env) publishN(lane, n int) []string {
	e.Helper()
	e.mu.Lock()
	next := e.count[lane]
	e.mu.Unlock()
	values := make([][]byte, n)
	for i := range values {
		values[i] = fmt.Appendf(nil, "value %d of lane %d", next+i, lane)
	}
	return e.publish(lane, values...)
}

func (e *env) ordered() bool { return !e.h.Features.Unordered }

// tag returns the tag of a delivered message.
func tag(m *consumer.Message) string {
	v, _ := m.Header(TagHeader)
	return string(v)
}

// tryFetch calls Fetch on the current source with a deadline of wait and
// checks what it returns against the contract, reporting violations with
// Errorf. It returns a nil batch when Fetch returned an error.
func (e *env) tryFetch(ctx context.Context, max int, wait time.Duration) (*consumer.Batch, error) {
	e.Helper()
	src := e.source()
	e.mu.Lock()
	gen := e.gen
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	b, err := src.Fetch(ctx, max)
	if err != nil {
		if b != nil && len(b.Messages) > 0 {
			e.Errorf("Fetch returned a batch of %d messages together with the error %v", len(b.Messages), err)
		}
		return nil, err
	}
	if b == nil || len(b.Messages) == 0 {
		e.Errorf("Fetch returned an empty batch (%v) without an error: it must block until it has messages", b)
		return nil, errEmpty
	}
	e.check(b, max, gen)
	return b, nil
}

var errEmpty = errors.New("sourcetest: empty batch")

// check records a batch and reports what breaks the contract in it.
func (e *env) check(b *consumer.Batch, limit, gen int) {
	e.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if gen != e.gen {
		return // fetched from a source replaced meanwhile
	}
	if len(b.Messages) > limit {
		e.Errorf("batch of %d messages, asked for at most %d", len(b.Messages), limit)
	}
	if b.Lane == "" {
		e.Errorf("batch without a lane")
	}
	if e.out[b.Lane] {
		e.Errorf("a second batch of lane %s while one is in flight", b.Lane)
	}
	e.out[b.Lane] = true
	for _, m := range b.Messages {
		tg := tag(m)
		p, ok := e.sent[tg]
		if !ok {
			e.Errorf("delivered a message the test did not publish (tag %q, ref %q, value %q)", tg, m.Ref, m.Value)
			continue
		}
		if m.Lane != b.Lane {
			e.Errorf("%s: Message.Lane %q in a batch of lane %q", tg, m.Lane, b.Lane)
		}
		if m.Source == "" || m.Ref == "" || m.ID == "" {
			e.Errorf("%s: Source %q, Ref %q, ID %q: none may be empty", tg, m.Source, m.Ref, m.ID)
		}
		if m.Attempt < 1 {
			e.Errorf("%s: Attempt %d, want at least 1", tg, m.Attempt)
		}
		if m.Time.IsZero() {
			e.Errorf("%s: Message.Time is not set", tg)
		}
		if !sameValue(m.Value, p.msg.Value, e.h.Features.NilValues) {
			e.Errorf("%s: value %s, published %s", tg, showValue(m.Value), showValue(p.msg.Value))
		}
		if ref, ok := e.refOf[tg]; ok && ref != m.Ref {
			e.Errorf("%s: redelivered with Ref %q, first delivered with %q: Ref must be stable", tg, m.Ref, ref)
		}
		if other, ok := e.tagOf[m.Ref]; ok && other != tg {
			e.Errorf("messages %s and %s share the Ref %q", other, tg, m.Ref)
		}
		e.refOf[tg], e.tagOf[m.Ref] = m.Ref, tg
		if last, ok := e.lastMsg[tg]; ok {
			if m.ID != last.id {
				e.Errorf("%s: redelivered with ID %q, delivered before with %q", tg, m.ID, last.id)
			}
		}
		if e.seen[tg] == 0 && e.ordered() {
			if prev, ok := e.first[p.lane]; ok && p.idx < prev {
				e.Errorf("lane order: %s (message %d of lane %d) delivered for the first time after message %d", tg, p.idx, p.lane, prev)
			}
			e.first[p.lane] = max(e.first[p.lane], p.idx)
		}
		if e.ordered() {
			if l, ok := e.laneOf[p.lane]; ok && l != b.Lane {
				e.Errorf("%s, published to lane %d, delivered on lane %s; lane %d's earlier messages came on %s", tg, p.lane, b.Lane, p.lane, l)
			}
			if q, ok := e.pubOf[b.Lane]; ok && q != p.lane {
				e.Errorf("lane %s delivers messages published to lanes %d and %d", b.Lane, q, p.lane)
			}
			e.laneOf[p.lane], e.pubOf[b.Lane] = b.Lane, p.lane
		}
		e.seen[tg]++
		e.lastMsg[tg] = consumerMsg{ref: m.Ref, id: m.ID, attempt: m.Attempt}
	}
}

// fetch is tryFetch that fails the test when nothing comes within the
// guard (plus the harness's redelivery delay).
func (e *env) fetch(max int) *consumer.Batch {
	e.Helper()
	b, err := e.tryFetch(context.Background(), max, fetchGuard+e.h.RedeliveryDelay)
	if err != nil {
		e.Fatalf("Fetch: %v", err)
	}
	return b
}

// settle settles b the way the consumer does: for a TxSource, BeforeCommit
// in a transaction that then commits (or rolls back when the lane is
// fenced, settling with nothing acknowledged), then Settle. It returns what
// Settle returned.
func (e *env) settle(src consumer.Source, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	e.Helper()
	ctx := context.Background()
	if txs, ok := src.(consumer.TxSource); ok {
		if e.b.DB == nil {
			e.Fatal("sourcetest: the source is a consumer.TxSource, and Broker.DB is nil")
		}
		tx, err := e.b.DB.Begin(ctx)
		if err != nil {
			e.Fatalf("begin: %v", err)
		}
		if err := txs.BeforeCommit(ctx, tx, b, ack); err != nil {
			_ = tx.Rollback(ctx)
			if !errors.Is(err, consumer.ErrFenced) {
				e.Errorf("BeforeCommit: %v", err)
			}
			ack, retry = nil, nil
		} else if err := tx.Commit(ctx); err != nil {
			e.Fatalf("commit: %v", err)
		}
	}
	e.mu.Lock()
	if src == e.src {
		delete(e.out, b.Lane)
	}
	e.mu.Unlock()
	err := src.Settle(ctx, b, ack, retry)
	if err == nil {
		e.mu.Lock()
		for _, m := range ack {
			e.acked[tag(m)] = true
		}
		e.mu.Unlock()
	}
	return err
}

// ack settles b with every message acknowledged, failing on an error.
func (e *env) ack(b *consumer.Batch) {
	e.Helper()
	if err := e.settle(e.source(), b, b.Messages, nil); err != nil {
		e.Errorf("Settle acknowledging every message: %v", err)
	}
}

// expectQuiet fails if the source delivers anything within wait.
func (e *env) expectQuiet(wait time.Duration, why string) {
	e.Helper()
	b, err := e.tryFetch(context.Background(), 100, wait)
	if err == nil {
		var tags []string
		for _, m := range b.Messages {
			tags = append(tags, fmt.Sprintf("%s (attempt %d)", tag(m), m.Attempt))
		}
		e.Errorf("%s, but the source delivered %v", why, tags)
		e.ack(b)
	}
}

// drain fetches until every tag in want was acknowledged, acknowledging
// everything, and returns the deliveries in order.
func (e *env) drain(max int, want []string) []*consumer.Message {
	e.Helper()
	left := map[string]bool{}
	e.mu.Lock()
	for _, t := range want {
		if !e.acked[t] {
			left[t] = true
		}
	}
	e.mu.Unlock()
	var got []*consumer.Message
	for len(left) > 0 {
		b := e.fetch(max)
		for _, m := range b.Messages {
			delete(left, tag(m))
			got = append(got, m)
		}
		e.ack(b)
	}
	return got
}

// quietWait is how long the suite watches for a delivery that must not
// come.
func (e *env) quietWait() time.Duration {
	return e.h.RedeliveryDelay + 500*time.Millisecond
}

// sameValue compares a delivered value with the published one; nil and
// empty differ only when the source tells them apart.
func sameValue(got, want []byte, nilDistinct bool) bool {
	if nilDistinct && (got == nil) != (want == nil) {
		return false
	}
	return bytes.Equal(got, want)
}

func showValue(v []byte) string {
	switch {
	case v == nil:
		return "nil"
	case len(v) > 40:
		return fmt.Sprintf("%q… (%d bytes)", v[:40], len(v))
	}
	return fmt.Sprintf("%q", v)
}

func tags(msgs []*consumer.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = tag(m)
	}
	return out
}
