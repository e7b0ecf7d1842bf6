package effotel_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/tracing/effotel"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// summary is what a span says about its batch, or what BatchStats say.
type summary struct {
	consumer, lane, strategy                                            string
	batch, messages, applied, duplicate, mismatch, parked, retried, gap int64
	reruns                                                              int64
	fenced, isolated, failed                                            bool
}

func fromStats(s consumer.BatchStats) summary {
	return summary{s.Consumer, s.Lane, s.Strategy, int64(s.Batch), int64(s.Size), int64(s.Applied), int64(s.Duplicate),
		int64(s.Mismatch), int64(s.Parked), int64(s.Retried), int64(s.Gap), int64(s.Reruns), s.Fenced, s.Isolated, s.Err != nil}
}

func fromSpan(t *testing.T, s sdktrace.ReadOnlySpan) summary {
	t.Helper()
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		attrs[kv.Key] = kv.Value
	}
	for _, k := range []attribute.Key{effotel.AttrConsumer, effotel.AttrLane, effotel.AttrStrategy, effotel.AttrMessages,
		effotel.AttrApplied, effotel.AttrDuplicate, effotel.AttrMismatch, effotel.AttrParked, effotel.AttrRetried,
		effotel.AttrGap, effotel.AttrFenced, effotel.AttrIsolated, effotel.AttrBatchMessageCount, effotel.AttrClaimSeconds,
		effotel.AttrBatchNumber, effotel.AttrReruns} {
		if _, ok := attrs[k]; !ok {
			t.Errorf("span %s lacks attribute %s", s.SpanContext().SpanID(), k)
		}
	}
	if attrs[effotel.AttrBatchMessageCount].AsInt64() != attrs[effotel.AttrMessages].AsInt64() {
		t.Errorf("messaging.batch.message_count %v != effectively.messages %v", attrs[effotel.AttrBatchMessageCount], attrs[effotel.AttrMessages])
	}
	if attrs["deployment"].AsString() != "test" {
		t.Errorf("span lacks the configured attribute deployment=test")
	}
	return summary{
		attrs[effotel.AttrConsumer].AsString(), attrs[effotel.AttrLane].AsString(), attrs[effotel.AttrStrategy].AsString(),
		attrs[effotel.AttrBatchNumber].AsInt64(),
		attrs[effotel.AttrMessages].AsInt64(), attrs[effotel.AttrApplied].AsInt64(), attrs[effotel.AttrDuplicate].AsInt64(),
		attrs[effotel.AttrMismatch].AsInt64(), attrs[effotel.AttrParked].AsInt64(), attrs[effotel.AttrRetried].AsInt64(),
		attrs[effotel.AttrGap].AsInt64(), attrs[effotel.AttrReruns].AsInt64(),
		attrs[effotel.AttrFenced].AsBool(), attrs[effotel.AttrIsolated].AsBool(),
		s.Status().Code == codes.Error,
	}
}

// TestSpanPerBatchMatchesStats runs a real consumer on Postgres with known
// traffic (new messages, producer duplicates, poison, one batch whose commit
// fails) and checks that each batch has one ended span whose attributes
// match the batch's stats, that the failed batch's span is an error, and
// that handlers run inside the batch span.
func TestSpanPerBatchMatchesStats(t *testing.T) {
	t.Parallel()
	const n, dups, poison = 120, 10, 4
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL);
		CREATE TABLE bomb (k text);
		CREATE FUNCTION bomb() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = 'serialization_failure'; END $$;
		CREATE CONSTRAINT TRIGGER bomb AFTER INSERT ON bomb DEFERRABLE INITIALLY DEFERRED
			FOR EACH ROW EXECUTE FUNCTION bomb()`); err != nil {
		t.Fatal(err)
	}
	broker := consumertest.New(consumertest.Config{Lanes: 3})
	for i := range n {
		body := "ok"
		if i%30 == 4 {
			body = "poison"
		}
		broker.Publish(i, consumer.Message{ID: fmt.Sprintf("m-%d", i), Value: []byte(body)})
	}
	for i := range dups {
		broker.Publish(3*i, consumer.Message{ID: fmt.Sprintf("m-%d", 3*i), Value: []byte("ok")})
	}

	var mu sync.Mutex
	bombed := false
	handlerSpans := map[trace.SpanID]bool{}
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		mu.Lock()
		handlerSpans[trace.SpanFromContext(ctx).SpanContext().SpanID()] = true
		bomb := m.ID == "m-50" && !bombed
		bombed = bombed || bomb
		mu.Unlock()
		if string(m.Value) == "poison" {
			return consumer.Permanent(errors.New("poison"))
		}
		if bomb {
			// The deferred trigger fails the commit with a serialization
			// failure, a transient refusal: the whole batch rolls back.
			if _, err := tx.Exec(ctx, `INSERT INTO bomb VALUES ('x')`); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects VALUES ($1)`, m.ID)
		return err
	}

	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	defer func() { _ = tp.Shutdown(ctx) }()
	hook := effotel.New(effotel.Options{TracerProvider: tp, Attributes: []attribute.KeyValue{attribute.String("deployment", "test")}})
	stats := &consumertest.Counter{}
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := consumertest.NewConsumer(t, pool, broker, consumer.Config{
		Name: "orders", Strategy: strategy, Handler: handler, BatchSize: 16,
		RetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond,
		Hooks: []consumer.Hook{hook, stats},
	})
	consumertest.RunUntilIdle(t, c, broker, 60*time.Second)
	batches := stats.Batches()

	if started := len(recorder.Started()); started != len(recorder.Ended()) {
		t.Errorf("%d spans started, %d ended", started, len(recorder.Ended()))
	}
	spans := recorder.Ended()
	if len(spans) != len(batches) || len(spans) == 0 {
		t.Fatalf("%d spans for %d batches", len(spans), len(batches))
	}
	var fromSpans, fromBatches []summary
	var total summary
	errorSpans := 0
	ids := map[trace.SpanID]bool{}
	numbers := map[int64]bool{}
	for _, s := range spans {
		if s.Name() != effotel.SpanName || s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("span %q of kind %v, want %q of kind consumer", s.Name(), s.SpanKind(), effotel.SpanName)
		}
		if s.InstrumentationScope().Name != effotel.ScopeName {
			t.Errorf("instrumentation scope %q", s.InstrumentationScope().Name)
		}
		ids[s.SpanContext().SpanID()] = true
		sum := fromSpan(t, s)
		fromSpans = append(fromSpans, sum)
		if numbers[sum.batch] || sum.batch < 1 {
			t.Errorf("batch number %d repeated or not positive", sum.batch)
		}
		numbers[sum.batch] = true
		if sum.failed {
			errorSpans++
			if len(s.Events()) == 0 || s.Events()[0].Name != "exception" {
				t.Errorf("error span without an exception event: %v", s.Events())
			}
		}
		total.applied += sum.applied
		total.duplicate += sum.duplicate
		total.parked += sum.parked
		total.messages += sum.messages
	}
	for _, s := range batches {
		fromBatches = append(fromBatches, fromStats(s))
	}
	cmp := func(a, b summary) int { return compareSummary(a, b) }
	slices.SortFunc(fromSpans, cmp)
	slices.SortFunc(fromBatches, cmp)
	if !slices.Equal(fromSpans, fromBatches) {
		t.Errorf("spans do not match the batches:\nspans   %+v\nbatches %+v", fromSpans, fromBatches)
	}
	if total.applied != n-poison || total.duplicate != dups || total.parked != poison {
		t.Errorf("spans count %d applied, %d duplicates, %d parked; want %d, %d, %d", total.applied, total.duplicate, total.parked, n-poison, dups, poison)
	}
	if total.messages != int64(broker.Stats().Delivered) {
		t.Errorf("spans count %d messages, broker delivered %d", total.messages, broker.Stats().Delivered)
	}
	if errorSpans != 1 {
		t.Errorf("%d error spans, want 1 (the batch whose commit failed)", errorSpans)
	}
	for id := range handlerSpans {
		if !ids[id] {
			t.Errorf("a handler ran under span %s, which is not a batch span", id)
		}
	}
}

func compareSummary(a, b summary) int {
	return strings.Compare(fmt.Sprintf("%+v", a), fmt.Sprintf("%+v", b))
}

// TestDefaultsToGlobalProvider checks that a Hook made without a provider
// uses the global one, records a failed batch as an error, and ignores a
// batch it did not start.
func TestDefaultsToGlobalProvider(t *testing.T) {
	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	defer otel.SetTracerProvider(prev)

	h := effotel.New(effotel.Options{})
	info := consumer.BatchInfo{Consumer: "c", Strategy: "idset", Lane: "lane-0", Batch: 9, Size: 3}
	ctx := h.BatchStart(context.Background(), info)
	h.BatchDone(ctx, &consumer.BatchStats{BatchInfo: info, Parked: 1, Isolated: true, Reruns: 2, Err: errors.New("commit: boom")})
	h.BatchDone(context.Background(), &consumer.BatchStats{BatchInfo: consumer.BatchInfo{Consumer: "c"}}) // not started here: ignored

	spans := recorder.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	s := spans[0]
	if s.Status().Code != codes.Error || s.Status().Description != "commit: boom" {
		t.Errorf("status %+v, want Error with the batch's error", s.Status())
	}
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		attrs[kv.Key] = kv.Value
	}
	for k, want := range map[attribute.Key]int64{effotel.AttrParked: 1, effotel.AttrReruns: 2, effotel.AttrBatchNumber: 9} {
		if v, ok := attrs[k]; !ok || v.AsInt64() != want {
			t.Errorf("%s = %v (set: %v), want %d", k, v.AsInt64(), ok, want)
		}
	}
	if got := attrs[effotel.AttrStrategy].AsString(); got != "idset" {
		t.Errorf("%s = %q, want idset", effotel.AttrStrategy, got)
	}
}
