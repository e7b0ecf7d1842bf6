package webhook

import (
	"fmt"
	"net/http"
	"runtime/debug"
	"slices"

	"github.com/effectively-once/effectively/consumer"
)

// defaultHeaders are the headers kept in Message.Headers when
// Config.Headers is nil: those that describe a delivery, of the schemes
// this package verifies and of the providers that use them. None carries a
// credential.
var defaultHeaders = []string{
	"Content-Type", "Content-Encoding", "User-Agent",
	// Stripe
	"Stripe-Signature",
	// GitHub
	"X-Github-Event", "X-Github-Delivery", "X-Github-Hook-Id",
	"X-Github-Hook-Installation-Target-Id", "X-Github-Hook-Installation-Target-Type",
	"X-Hub-Signature-256", "X-Hub-Signature",
	// Standard Webhooks, and Svix's name for the same headers
	"Webhook-Id", "Webhook-Timestamp", "Webhook-Signature",
	"Svix-Id", "Svix-Timestamp", "Svix-Signature",
}

// DefaultHeaders returns the canonical names of the headers kept in
// Message.Headers (and so in the parked table) when Config.Headers is nil:
// Content-Type, Content-Encoding, User-Agent, and the event, delivery and
// signature headers of Stripe, GitHub and Standard Webhooks. Append to it
// to keep more: Config{Headers: append(webhook.DefaultHeaders(), "X-Shopify-Topic")}.
func DefaultHeaders() []string { return slices.Clone(defaultHeaders) }

// credentialHeaders carry credentials: Config.Headers may not list them,
// so that they never reach the parked table.
var credentialHeaders = []string{
	"Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie",
	"X-Api-Key", "X-Amz-Security-Token", "X-Auth-Token", "X-Csrf-Token",
}

// checkHeaders validates Config.Headers.
func checkHeaders(names []string) error {
	for _, h := range names {
		if h == "" {
			return fmt.Errorf("holds an empty header name")
		}
		if slices.Contains(credentialHeaders, http.CanonicalHeaderKey(h)) {
			return fmt.Errorf("lists %s, which carries a credential and would be kept in the parked table; read it in the Verifier or the ID function instead, or copy what is safe to keep into a header of its own in Redact", http.CanonicalHeaderKey(h))
		}
	}
	return nil
}

// copyHeaders returns the request headers kept in Message.Headers, in the
// order of s.headers and of their values.
func (s *Source) copyHeaders(h http.Header) []consumer.Header {
	var out []consumer.Header
	for _, name := range s.headers {
		for _, v := range h[name] {
			out = append(out, consumer.Header{Key: name, Value: []byte(v)})
		}
	}
	return out
}

// redact runs Config.Redact on m, which may change m.Value and m.Headers
// only; a panic is returned as an error.
func (s *Source) redact(m *consumer.Message) (err error) {
	if s.cfg.Redact == nil {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("webhook: Config.Redact panicked: %v\n%s", r, debug.Stack())
		}
	}()
	id, ref, lane, src, at := m.ID, m.Ref, m.Lane, m.Source, m.Time
	s.cfg.Redact(m)
	// What names and places the message is not Redact's to change.
	m.ID, m.Ref, m.Lane, m.Source, m.Time = id, ref, lane, src, at
	return nil
}
