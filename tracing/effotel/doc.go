// Package effotel traces a consumer's batches with OpenTelemetry: one
// span per batch, named "effectively.batch", of kind consumer. It lives in
// its own package so that the core carries no dependency on OpenTelemetry.
//
//	tracer := effotel.New(effotel.Options{TracerProvider: tp})
//	c, err := consumer.New(db, src, consumer.Config{..., Hooks: []consumer.Hook{tracer}})
//
// The span starts when the batch starts and ends once the batch is settled
// with its source. Its context is the context of the batch's work, so spans
// the handler starts from its ctx (database calls traced through pgx's
// tracer hooks, say) are its children.
//
// At start the span carries effectively.consumer, effectively.strategy,
// effectively.lane, effectively.batch_number (the consumer's number for the
// batch, consumer.BatchInfo.Batch) and effectively.messages (also as
// messaging.batch.message_count); at the end, the outcome counts
// effectively.applied, effectively.duplicate, effectively.mismatch,
// effectively.parked, effectively.retried and effectively.gap, the flags
// effectively.fenced and effectively.isolated, effectively.reruns (handler
// calls beyond the first for a message within the batch, while a failing
// one was isolated: consumer.BatchStats.Reruns), and the phase durations
// in seconds (effectively.claim_seconds, effectively.handle_seconds,
// effectively.commit_seconds, effectively.ack_seconds). A batch that rolled
// back (BatchStats.Err, which includes a fenced batch) records the error and
// sets the span's status to Error.
//
// A request through the Idempotency-Key middleware (package idempotency,
// whose Config.Hooks takes the same hook) is traced as an HTTP server
// span instead, named by its method and route ("POST /payments/{id}"),
// with the HTTP convention's http.request.method, http.route, url.path and
// http.response.status_code, and effectively.replayed (answered with a
// stored response), besides the attributes above. As the convention has
// it for a server, a 4xx leaves the span's status unset and a 5xx (or no
// answer) sets it to Error.
//
// NewRelay returns a hook for outbox.RelayConfig.Hooks that records a span
// per relay publish pass, named "effectively.outbox.publish", of kind
// producer, from the pass's fetch to its marking, with effectively.relay,
// effectively.sinks, effectively.messages (rows read), effectively.published,
// effectively.retried, effectively.parked, effectively.held,
// effectively.expired, effectively.marked and effectively.publish_seconds. A
// pass that ended in an error records it and has status Error.
package effotel
