package effotel_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/tracing/effotel"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// passSink publishes into nowhere, refusing "bad" for good and failing
// "slow" every time.
type passSink struct{}

func (passSink) Publish(_ context.Context, msgs []outbox.Message) error {
	errs := outbox.PublishErrors{}
	for i, m := range msgs {
		switch m.ID {
		case "bad":
			errs[i] = outbox.Permanent(errors.New("too large"))
		case "slow":
			errs[i] = errors.New("broker unavailable")
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// passes records the relay's pass events.
type passes struct {
	mu sync.Mutex
	s  []outbox.PassStats
}

func (p *passes) PassDone(_ context.Context, s *outbox.PassStats) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.s = append(p.s, *s)
}

// TestSpanPerRelayPass runs a real relay over Postgres: each pass that
// read rows has one ended producer span whose counts match the pass's.
func TestSpanPerRelayPass(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	o, err := outbox.New(outbox.Config{Mode: outbox.TableMode})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Migrate(ctx, pool, "", o.Line()); err != nil {
		t.Fatal(err)
	}
	const ok = 30
	msgs := []outbox.Message{{Sink: "orders", Key: []byte("a"), ID: "bad"}, {Sink: "orders", Key: []byte("b"), ID: "slow"}}
	for i := range ok {
		msgs = append(msgs, outbox.Message{Sink: "orders", Key: []byte(fmt.Sprint(i % 7)), ID: fmt.Sprintf("m%d", i)})
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return o.Emit(ctx, tx, msgs...) }); err != nil {
		t.Fatal(err)
	}

	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	defer func() { _ = tp.Shutdown(ctx) }()
	hook := effotel.NewRelay(effotel.Options{TracerProvider: tp, Attributes: []attribute.KeyValue{attribute.String("deployment", "test")}})
	rec := &passes{}
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Owner: "relay-1", Sinks: map[string]outbox.Sink{"orders": passSink{}},
		Hooks: []outbox.RelayHook{rec, hook}, BatchSize: 8, PollInterval: 20 * time.Millisecond, LeaseTTL: 2 * time.Second,
		MinBackoff: time.Hour, MaxBackoff: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		rec.mu.Lock()
		published, parked := 0, 0
		for _, s := range rec.s {
			p, _, k, _ := s.Counts()
			published, parked = published+p, parked+k
		}
		rec.mu.Unlock()
		if published == ok && parked == 1 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("timed out: published %d, parked %d", published, parked)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	var spans []sdktrace.ReadOnlySpan
	for _, s := range recorder.Ended() {
		if s.Name() == effotel.RelaySpanName {
			spans = append(spans, s)
		}
	}
	if len(spans) != len(rec.s) {
		t.Fatalf("%d pass spans for %d passes", len(spans), len(rec.s))
	}
	for i, sp := range spans {
		want := rec.s[i]
		attrs := map[attribute.Key]attribute.Value{}
		for _, kv := range sp.Attributes() {
			attrs[kv.Key] = kv.Value
		}
		published, retried, parked, held := want.Counts()
		got := []int64{attrs[effotel.AttrMessages].AsInt64(), attrs[effotel.AttrPublished].AsInt64(), attrs[effotel.AttrRetried].AsInt64(),
			attrs[effotel.AttrParked].AsInt64(), attrs[effotel.AttrHeld].AsInt64(), attrs[effotel.AttrMarked].AsInt64()}
		exp := []int64{int64(want.Read), int64(published), int64(retried), int64(parked), int64(held), want.Marked}
		if !slices.Equal(got, exp) {
			t.Errorf("span %d: read/published/retried/parked/held/marked %v, pass %v", i, got, exp)
		}
		if attrs[effotel.AttrRelay].AsString() != "relay-1" || !slices.Equal(attrs[effotel.AttrSinks].AsStringSlice(), []string{"orders"}) ||
			attrs["deployment"].AsString() != "test" {
			t.Errorf("span %d attributes %v", i, sp.Attributes())
		}
		if sp.SpanKind() != trace.SpanKindProducer || sp.Status().Code == codes.Error || !sp.EndTime().After(sp.StartTime()) {
			t.Errorf("span %d: kind %v status %v, %v to %v", i, sp.SpanKind(), sp.Status(), sp.StartTime(), sp.EndTime())
		}
	}
}
