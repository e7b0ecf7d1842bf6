package effotel

import (
	"context"
	"net/http"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/idempotency"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// SpanName is the name of the span of a batch.
const SpanName = "effectively.batch"

// ScopeName is the instrumentation scope of the tracer the hook uses.
const ScopeName = "github.com/effectively-once/effectively/tracing/effotel"

// Attribute keys of the batch span.
const (
	AttrConsumer      = attribute.Key("effectively.consumer")
	AttrLane          = attribute.Key("effectively.lane")
	AttrBatchNumber   = attribute.Key("effectively.batch_number")
	AttrMessages      = attribute.Key("effectively.messages")
	AttrStrategy      = attribute.Key("effectively.strategy")
	AttrApplied       = attribute.Key("effectively.applied")
	AttrDuplicate     = attribute.Key("effectively.duplicate")
	AttrMismatch      = attribute.Key("effectively.mismatch")
	AttrParked        = attribute.Key("effectively.parked")
	AttrRetried       = attribute.Key("effectively.retried")
	AttrGap           = attribute.Key("effectively.gap")
	AttrUnknown       = attribute.Key("effectively.unknown")
	AttrFenced        = attribute.Key("effectively.fenced")
	AttrIsolated      = attribute.Key("effectively.isolated")
	AttrReruns        = attribute.Key("effectively.reruns")
	AttrClaimSeconds  = attribute.Key("effectively.claim_seconds")
	AttrHandleSeconds = attribute.Key("effectively.handle_seconds")
	AttrCommitSeconds = attribute.Key("effectively.commit_seconds")
	AttrAckSeconds    = attribute.Key("effectively.ack_seconds")
	// AttrBatchMessageCount is the OpenTelemetry messaging convention's
	// name for the number of messages in a batch.
	AttrBatchMessageCount = attribute.Key("messaging.batch.message_count")
	// AttrReplayed is true on the server span of a request through the
	// Idempotency-Key middleware that was answered with a stored response.
	AttrReplayed = attribute.Key("effectively.replayed")
	// The OpenTelemetry HTTP server convention's attributes, on the span of
	// a request through the Idempotency-Key middleware.
	AttrHTTPMethod     = attribute.Key("http.request.method")
	AttrHTTPRoute      = attribute.Key("http.route")
	AttrHTTPStatusCode = attribute.Key("http.response.status_code")
	AttrURLPath        = attribute.Key("url.path")
)

// Options configures a Hook. The zero value is usable.
type Options struct {
	// TracerProvider creates the hook's tracer. Defaults to the global
	// provider, otel.GetTracerProvider(), as it is when New is called (the
	// global provider forwards to one set later with otel.SetTracerProvider).
	TracerProvider trace.TracerProvider
	// Attributes are added to every batch span, such as the service's
	// deployment or the source's topic. Defaults to none.
	Attributes []attribute.KeyValue
}

// Hook starts a span per batch. It implements consumer.Hook and
// consumer.BatchStartHook; pass it in consumer.Config.Hooks. It is safe for
// concurrent use.
type Hook struct {
	tracer trace.Tracer
	attrs  []attribute.KeyValue
}

var (
	_ consumer.Hook           = (*Hook)(nil)
	_ consumer.BatchStartHook = (*Hook)(nil)
)

// New returns a Hook.
func New(opts Options) *Hook {
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return &Hook{
		tracer: tp.Tracer(ScopeName),
		attrs:  append([]attribute.KeyValue(nil), opts.Attributes...),
	}
}

// spanKey finds the hook's own span in the batch's context, even when
// another hook started a span after it.
type spanKey struct{ h *Hook }

// BatchStart implements consumer.BatchStartHook: it starts the batch span.
func (h *Hook) BatchStart(ctx context.Context, b consumer.BatchInfo) context.Context {
	attrs := make([]attribute.KeyValue, 0, 6+len(h.attrs))
	attrs = append(attrs,
		AttrConsumer.String(b.Consumer),
		AttrStrategy.String(b.Strategy),
		AttrLane.String(b.Lane),
		AttrBatchNumber.Int64(int64(b.Batch)),
		AttrMessages.Int(b.Size),
		AttrBatchMessageCount.Int(b.Size),
	)
	attrs = append(attrs, h.attrs...)
	name, kind := SpanName, trace.SpanKindConsumer
	if r := idempotency.RequestOf(ctx); r != nil {
		// A request through the Idempotency-Key middleware: an HTTP server
		// span, named as the HTTP convention names it.
		name, kind = r.Method, trace.SpanKindServer
		attrs = append(attrs, AttrHTTPMethod.String(r.Method), AttrURLPath.String(r.Path))
		if r.Route != "" {
			name += " " + r.Route
			attrs = append(attrs, AttrHTTPRoute.String(r.Route))
		}
	}
	ctx, span := h.tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
	return context.WithValue(ctx, spanKey{h}, span)
}

// BatchDone implements consumer.Hook: it records the batch's outcome on its
// span and ends it.
func (h *Hook) BatchDone(ctx context.Context, s *consumer.BatchStats) {
	span, ok := ctx.Value(spanKey{h}).(trace.Span)
	if !ok {
		return // the batch did not start through this hook
	}
	span.SetAttributes(
		AttrApplied.Int(s.Applied),
		AttrDuplicate.Int(s.Duplicate),
		AttrMismatch.Int(s.Mismatch),
		AttrParked.Int(s.Parked),
		AttrRetried.Int(s.Retried),
		AttrGap.Int(s.Gap),
		AttrUnknown.Int(s.Unknown),
		AttrFenced.Bool(s.Fenced),
		AttrIsolated.Bool(s.Isolated),
		AttrReruns.Int(s.Reruns),
		AttrClaimSeconds.Float64(s.Claim.Seconds()),
		AttrHandleSeconds.Float64(s.Handle.Seconds()),
		AttrCommitSeconds.Float64(s.Commit.Seconds()),
		AttrAckSeconds.Float64(s.Ack.Seconds()),
	)
	if r := idempotency.RequestOf(ctx); r != nil {
		span.SetAttributes(AttrHTTPStatusCode.Int(r.Status), AttrReplayed.Bool(r.Replayed))
		// As the HTTP convention has it for a server: a 4xx is the
		// client's, and leaves the status unset; a 5xx, or no answer, is
		// an error.
		if r.Status >= 500 || r.Status == 0 {
			if s.Err != nil {
				span.RecordError(s.Err)
			}
			span.SetStatus(codes.Error, http.StatusText(r.Status))
		}
		span.End()
		return
	}
	if s.Err != nil {
		span.RecordError(s.Err)
		span.SetStatus(codes.Error, s.Err.Error())
	}
	span.End()
}
