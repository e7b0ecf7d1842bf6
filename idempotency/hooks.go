package idempotency

import (
	"context"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe"
)

// hooks are Config.Hooks with their optional interfaces resolved once.
type hooks struct {
	all      []consumer.Hook
	starters []consumer.BatchStartHook
	messages []consumer.MessageHook
	batch    atomic.Uint64
}

func newHooks(hs []consumer.Hook) *hooks {
	h := &hooks{all: hs}
	for _, x := range hs {
		if s, ok := x.(consumer.BatchStartHook); ok {
			h.starters = append(h.starters, s)
		}
		if mh, ok := x.(consumer.MessageHook); ok {
			h.messages = append(h.messages, mh)
		}
	}
	return h
}

// ResponsesStrategy is the strategy name hooks are told (BatchInfo.Strategy)
// for a middleware without Config.Strategy, whose keys are claimed by
// their rows in the responses table.
const ResponsesStrategy = "responses"

func (m *Middleware) strategyName() string {
	if m.cfg.Strategy == nil {
		return ResponsesStrategy
	}
	return m.cfg.Strategy.Name()
}

// span is one request's report: a batch of one message.
type span struct {
	ctx   context.Context
	start time.Time
	stats consumer.BatchStats
	msg   consumer.Message
}

// begin reports a request with a key as a batch starting, and returns the
// context the hooks gave back (carrying a trace span, say).
func (m *Middleware) begin(ctx context.Context, r *http.Request, k dedupe.Key, body []byte) *span {
	sp := &span{ctx: ctx, start: time.Now()}
	if len(m.hooks.all) == 0 {
		return sp
	}
	info := consumer.BatchInfo{
		Consumer: m.cfg.Name,
		Strategy: m.strategyName(),
		Lane:     r.Method + " " + r.URL.Path,
		Batch:    m.hooks.batch.Add(1),
		Size:     1,
	}
	sp.stats.BatchInfo = info
	sp.msg = consumer.Message{
		Value:     body,
		Source:    "http",
		Lane:      info.Lane,
		Ref:       k.ID,
		Attempt:   1,
		ID:        k.ID,
		DedupeKey: k,
	}
	for _, s := range m.hooks.starters {
		sp.ctx = s.BatchStart(sp.ctx, info)
	}
	return sp
}

// end reports the request's outcome: BatchDone with its one count, then
// MessageDone.
func (m *Middleware) end(sp *span, o consumer.Outcome, err error) {
	if len(m.hooks.all) == 0 {
		return
	}
	st := &sp.stats
	switch o {
	case consumer.OutcomeApplied:
		st.Applied = 1
	case consumer.OutcomeDuplicate:
		st.Duplicate = 1
	case consumer.OutcomeMismatch:
		st.Mismatch = 1
	case consumer.OutcomeRetried:
		st.Retried = 1
	case consumer.OutcomeUnknown:
		st.Unknown = 1
	}
	st.Err = err
	st.Total = time.Since(sp.start)
	for _, h := range m.hooks.all {
		h.BatchDone(sp.ctx, st)
	}
	for _, h := range m.hooks.messages {
		h.MessageDone(sp.ctx, consumer.MessageEvent{BatchInfo: st.BatchInfo, Message: &sp.msg, Outcome: o, Err: err})
	}
}
