package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/jackc/pgx/v5"
)

// batchCtxKey marks a batch's context, as a tracing hook's span would.
type batchCtxKey struct{}

// eventLog records what the hooks are told, checking that the context
// BatchStart returned is the one the batch's other calls receive.
type eventLog struct {
	t        *testing.T
	mu       sync.Mutex
	started  map[uint64]consumer.BatchInfo
	done     map[uint64]consumer.BatchInfo
	messages []consumer.MessageEvent
}

func (l *eventLog) BatchStart(ctx context.Context, b consumer.BatchInfo) context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.started[b.Batch]; dup {
		l.t.Errorf("batch number %d started twice", b.Batch)
	}
	l.started[b.Batch] = b
	return context.WithValue(ctx, batchCtxKey{}, b.Batch)
}

func (l *eventLog) BatchDone(ctx context.Context, s *consumer.BatchStats) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if got, _ := ctx.Value(batchCtxKey{}).(uint64); got != s.Batch {
		l.t.Errorf("BatchDone of batch %d got the context of batch %d", s.Batch, got)
	}
	l.done[s.Batch] = s.BatchInfo
}

func (l *eventLog) MessageDone(ctx context.Context, e consumer.MessageEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if got, _ := ctx.Value(batchCtxKey{}).(uint64); got != e.Batch {
		l.t.Errorf("MessageDone of batch %d got the context of batch %d", e.Batch, got)
	}
	l.messages = append(l.messages, e)
}

var (
	_ consumer.BatchStartHook = (*eventLog)(nil)
	_ consumer.MessageHook    = (*eventLog)(nil)
)

// ctxRecords is a slog.Handler that keeps each record's message with the
// batch number found in the context it was logged with.
type ctxRecords struct {
	mu      sync.Mutex
	records []ctxRecord
}

type ctxRecord struct {
	msg      string
	ctxBatch uint64 // from the context
	batch    int64  // the record's "batch" attribute
}

func (h *ctxRecords) Enabled(context.Context, slog.Level) bool { return true }
func (h *ctxRecords) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *ctxRecords) WithGroup(string) slog.Handler            { return h }
func (h *ctxRecords) Handle(ctx context.Context, r slog.Record) error {
	rec := ctxRecord{msg: r.Message, batch: -1}
	rec.ctxBatch, _ = ctx.Value(batchCtxKey{}).(uint64)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "batch" {
			rec.batch = int64(a.Value.Uint64())
		}
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, rec)
	return nil
}

// TestHooksSayWhoAndWhat runs a consumer over three lanes and checks that
// every hook call names its consumer, strategy, lane and batch, that batch
// numbers are distinct and count up from 1, that the context a start hook
// returns reaches the batch's other hooks, and that the consumer logs with
// that context (so a trace ID in it reaches the logs).
func TestHooksSayWhoAndWhat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 3})
	const n = 60
	for i, id := range ids("m", n) {
		e.broker.Publish(i, msg(id, "ok"))
	}
	e.broker.Publish(1, msg("m-1", "ok"))         // a duplicate
	e.broker.Publish(2, msg("poison", "refused")) // parked at once
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "poison" {
			return consumer.Permanent(errors.New("refused"))
		}
		return insertEffect(ctx, tx, m)
	}
	events := &eventLog{t: t, started: map[uint64]consumer.BatchInfo{}, done: map[uint64]consumer.BatchInfo{}}
	logs := &ctxRecords{}
	c := e.consumer(consumer.Config{Name: "hooks", Handler: handler, BatchSize: 7,
		Logger: slog.New(logs), Hooks: []consumer.Hook{events}})
	e.runUntilIdle(c, 30*time.Second)

	events.mu.Lock()
	defer events.mu.Unlock()
	if len(events.started) == 0 || len(events.started) != len(events.done) {
		t.Fatalf("%d batches started, %d done", len(events.started), len(events.done))
	}
	size := 0
	for num := uint64(1); num <= uint64(len(events.started)); num++ {
		b, ok := events.started[num]
		if !ok {
			t.Fatalf("batch numbers %v are not 1 to %d", keys(events.started), len(events.started))
		}
		if b != events.done[num] {
			t.Errorf("batch %d started as %+v, done as %+v", num, b, events.done[num])
		}
		if b.Consumer != "hooks" || b.Strategy != "idset" || b.Lane == "" || b.Size < 1 {
			t.Errorf("batch %+v does not say who and what", b)
		}
		size += b.Size
	}
	if delivered := e.broker.Stats().Delivered; size != delivered {
		t.Errorf("batch sizes add up to %d, broker delivered %d", size, delivered)
	}

	outcomes := map[consumer.Outcome]int{}
	parkedIn := uint64(0)
	for _, m := range events.messages {
		if b := events.started[m.Batch]; m.BatchInfo != b {
			t.Errorf("message %s reported with batch %+v, which started as %+v", m.Message.ID, m.BatchInfo, b)
		}
		if m.Message.Lane != m.Lane {
			t.Errorf("message %s of lane %q reported in a batch of lane %q", m.Message.ID, m.Message.Lane, m.Lane)
		}
		outcomes[m.Outcome]++
		if m.Message.ID == "poison" {
			var pe *consumer.ParkedError
			if m.Outcome != consumer.OutcomeParked || !errors.As(m.Err, &pe) || pe.Reason != "permanent" {
				t.Errorf("poison reported as %v, %v; want parked with a permanent *ParkedError", m.Outcome, m.Err)
			}
			parkedIn = m.Batch
		}
	}
	if outcomes[consumer.OutcomeApplied] != n || outcomes[consumer.OutcomeDuplicate] != 1 || outcomes[consumer.OutcomeParked] != 1 {
		t.Errorf("outcomes %v, want %d applied, 1 duplicate, 1 parked", outcomes, n)
	}

	logs.mu.Lock()
	defer logs.mu.Unlock()
	found := false
	for _, r := range logs.records {
		if r.msg != "message parked" {
			continue
		}
		found = true
		if r.ctxBatch != parkedIn || r.batch != int64(parkedIn) {
			t.Errorf("the parking was logged with the context of batch %d and batch=%d, want batch %d", r.ctxBatch, r.batch, parkedIn)
		}
	}
	if !found {
		t.Error(`no "message parked" record`)
	}
}

func keys(m map[uint64]consumer.BatchInfo) []uint64 {
	out := make([]uint64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
