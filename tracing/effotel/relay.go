package effotel

import (
	"context"
	"time"

	"github.com/effectively-once/effectively/outbox"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// RelaySpanName is the name of the span of an outbox relay's publish pass.
const RelaySpanName = "effectively.outbox.publish"

// Attribute keys of the publish pass span, besides AttrMessages (the rows
// the pass read), AttrParked and AttrRetried.
const (
	AttrRelay          = attribute.Key("effectively.relay")
	AttrSinks          = attribute.Key("effectively.sinks")
	AttrPublished      = attribute.Key("effectively.published")
	AttrHeld           = attribute.Key("effectively.held")
	AttrExpired        = attribute.Key("effectively.expired")
	AttrMarked         = attribute.Key("effectively.marked")
	AttrPublishSeconds = attribute.Key("effectively.publish_seconds")
)

// RelayHook records a span per outbox relay publish pass. It implements
// outbox.RelayHook; pass it in outbox.RelayConfig.Hooks. It is safe for
// concurrent use.
type RelayHook struct {
	tracer trace.Tracer
	attrs  []attribute.KeyValue
}

var _ outbox.RelayHook = (*RelayHook)(nil)

// NewRelay returns a RelayHook configured as New configures a Hook.
func NewRelay(opts Options) *RelayHook {
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return &RelayHook{
		tracer: tp.Tracer(ScopeName),
		attrs:  append([]attribute.KeyValue(nil), opts.Attributes...),
	}
}

// PassDone implements outbox.RelayHook: it records the pass as a span
// from its start to its end, with its counts as attributes.
func (h *RelayHook) PassDone(ctx context.Context, s *outbox.PassStats) {
	end := time.Now()
	published, retried, parked, held := s.Counts()
	sinks := make([]string, len(s.Sinks))
	var publish time.Duration
	for i, p := range s.Sinks {
		sinks[i] = p.Sink
		publish += p.Publish
	}
	attrs := make([]attribute.KeyValue, 0, 11+len(h.attrs))
	attrs = append(attrs,
		AttrRelay.String(s.Owner),
		AttrSinks.StringSlice(sinks),
		AttrMessages.Int(s.Read),
		AttrBatchMessageCount.Int(s.Read),
		AttrPublished.Int(published),
		AttrRetried.Int(retried),
		AttrParked.Int(parked),
		AttrHeld.Int(held),
		AttrExpired.Int(s.Expired),
		AttrMarked.Int64(s.Marked),
		AttrPublishSeconds.Float64(publish.Seconds()),
	)
	attrs = append(attrs, h.attrs...)
	_, span := h.tracer.Start(ctx, RelaySpanName, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithTimestamp(end.Add(-s.Total)), trace.WithAttributes(attrs...))
	if s.Err != nil {
		span.RecordError(s.Err)
		span.SetStatus(codes.Error, s.Err.Error())
	}
	span.End(trace.WithTimestamp(end))
}
