// Package webhook is a consumer.Source fed by HTTP requests: an
// effectively-once webhook receiver. A provider's deliveries (Stripe,
// GitHub, Standard Webhooks senders such as Svix, Clerk and Resend, any
// sender that retries until it gets a 2xx) go through the same
// consumer loop, dedupe strategies and parked table as Kafka and SQS
// messages, and each request is answered only once its event's outcome
// committed.
//
//	v, _ := webhook.NewStripeVerifier(webhook.StripeConfig{Secrets: []string{secret}})
//	src, _ := webhook.New(webhook.Config{Verifier: v, ID: webhook.JSONField("id")})
//	mux.Handle("POST /webhooks/stripe", src)
//	c, _ := consumer.New(pool, src, consumer.Config{Name: "stripe", Strategy: ids, Handler: apply})
//	go c.Run(ctx)
//
// # A request's path
//
// ServeHTTP reads the body (at most Config.MaxBodyBytes, else 413) and has
// Config.Verifier check it; a request that fails is answered 401 (400 for a
// malformed signature header), logged, passed to Config.Observe and
// forgotten: nothing of it is applied, queued or parked. The event ID comes
// from Config.ID, or, with a SignedIDVerifier (GitHubVerifier,
// StandardVerifier), from what the signature covers, so that a captured
// delivery sent again with other headers is a duplicate. A verified
// request whose ID cannot be derived is handed on with an empty
// Message.ID, which the consumer's default KeyFunc cannot key, so the
// consumer parks it with reason invalid_key and the request is answered
// 200: the body is kept for a person to look at, and the provider stops
// sending it. Such a message has Ref BodyID(body) and no headers, so that
// the same signed body sent again (a captured delivery replayed, with
// whatever unsigned headers) is folded into the same parked row rather
// than filling the table.
//
// The message then waits in its lane until the consumer fetches it, and
// the request waits for the batch to settle:
//
//   - 200 when the outcome committed: applied, a duplicate of an event
//     seen before, or parked (a handler error wrapped with
//     consumer.Permanent, or the last of consumer.Config.MaxAttempts);
//   - 500 when the handler failed and the consumer handed the message back
//     for a retry: nothing of it committed, and the source forgets it, for
//     the provider's redelivery is the retry (Retry-After carries the
//     consumer's delay, which providers may ignore);
//   - 503 when no consumer is fetching from the source (not started yet,
//     or stopped), the source is closed, or the consumer stopped before the
//     batch settled.
//
// A client that goes away before its message was fetched has it taken off
// the queue: it was never processed, and the provider delivers it again. A
// client that goes away later is answered nothing, but its outcome commits
// or not as if it had stayed; a redelivery of an event that committed is a
// duplicate.
//
// # Attempts
//
// A provider's redelivery is a new request, but Message.Attempt counts on
// across them: the source keeps, per event ID, the number of deliveries
// handed to the consumer that were not acknowledged, so an event whose
// handler keeps failing reaches consumer.Config.MaxAttempts and is parked
// (answered 200). A delivery that never reached a handler (abandoned at
// shutdown, or whose client left before it was fetched) is not counted,
// and an acknowledged event is forgotten. With Config.DB set the counts
// are kept in PostgreSQL too (a table of this package, read once per batch
// and written once it settled), so they survive a restart and
// are shared by the processes behind a load balancer. Without it they are
// kept in memory, in this process, for at most Config.MaxTracked events
// (the least recently seen is forgotten first): behind a load balancer
// with several processes, or after a restart, an event may then take more
// deliveries to be parked.
//
// # Lanes
//
// Providers do not promise to deliver events in order (Stripe says so
// outright), so by default the source spreads them over Config.Lanes lanes by
// a hash of the event ID, and the consumer runs batches of different lanes
// in parallel. Config.Lane chooses lanes instead (a customer's events in
// one lane, say): events of one lane are handed to the consumer in arrival
// order, one batch at a time, but an event answered 500 comes back when
// the provider redelivers it, after later ones.
//
// # Messages
//
// Message.Source is "webhook"; Message.ID is the event ID; Message.Value is
// the body byte for byte (an empty body is a non-nil empty slice);
// Message.Headers are the request's headers named in Config.Headers
// (DefaultHeaders when unset: none that carries a credential), after
// Config.Redact, which may also mask the body;
// Message.Time is when the request arrived; Message.Ref is the event ID,
// the same in every delivery of the event, since a provider's redelivery
// is the same message delivered again (a delivery without an event ID has
// Ref BodyID(body), see above).
// Message.Key is nil.
//
// # Shutting down
//
// Shut the HTTP server down first (http.Server.Shutdown waits for the
// requests in progress, which wait for their batches), then stop the
// consumer, then Close the source. Requests that reach a source whose
// consumer stopped are answered 503. See docs/webhooks.md.
package webhook
