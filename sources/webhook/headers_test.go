package webhook_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/sources/webhook"
	"github.com/jackc/pgx/v5"
)

// secretHeaders are credentials a request may carry, set by a proxy, an
// SDK or a misconfigured provider; none may reach the parked table.
var secretHeaders = map[string]string{
	"Authorization":        "Bearer sk_live_parked",
	"Proxy-Authorization":  "Basic cGFya2Vk",
	"Cookie":               "session=parked",
	"X-Api-Key":            "key_parked",
	"X-Amz-Security-Token": "FwoGZXIvYXdzEParked",
	"X-Forwarded-For":      "10.0.0.7",
	"X-Internal-Token":     "internal_parked",
}

// postWith delivers body signed now with extra headers.
func (e *env) postWith(body []byte, extra map[string]string) int {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/hooks/stripe", bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
	req.Header.Set("Stripe-Signature", stripeSign(testSecret, time.Now(), body))
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestParkedHeadersAllowlist: by default only the headers that describe a
// delivery (content type, user agent, the providers' event, delivery and
// signature headers) are kept with a message, so a credential a request
// carries never reaches the parked table; a header listed in
// Config.Headers is kept, and a credential header cannot be listed.
func TestParkedHeadersAllowlist(t *testing.T) {
	t.Parallel()
	handler := func(context.Context, pgx.Tx, *consumer.Message) error {
		return consumer.Permanent(errors.New("unknown event type"))
	}
	e := newEnv(t, webhook.Config{}, consumer.Config{Handler: handler})
	e.start()
	if got := e.postWith(event("evt_secrets", 1), secretHeaders); got != http.StatusOK {
		t.Fatalf("answered %d, want 200", got)
	}
	p := e.parked()
	if len(p) != 1 {
		t.Fatalf("%d parked rows, want 1", len(p))
	}
	for name := range secretHeaders {
		if hasHeader(p[0], name) {
			t.Errorf("the parked row keeps %s", name)
		}
	}
	for _, name := range []string{"Content-Type", "User-Agent", "Stripe-Signature"} {
		if !hasHeader(p[0], name) {
			t.Errorf("the parked row lost %s: %v", name, p[0].Headers)
		}
	}

	for _, name := range []string{"authorization", "Cookie", "X-Api-Key", "x-amz-security-token", "Proxy-Authorization", "Set-Cookie"} {
		_, err := webhook.New(webhook.Config{Verifier: webhook.Unverified(), ID: webhook.JSONField("id"), Headers: []string{"Content-Type", name}, Logger: testLogger()})
		var ce *webhook.ConfigError
		if !errors.As(err, &ce) || ce.Field != "Headers" {
			t.Errorf("Headers listing %s: %v, want a ConfigError for Headers", name, err)
		}
	}
	if got := webhook.DefaultHeaders(); len(got) == 0 || got[0] == "" {
		t.Fatalf("DefaultHeaders %v", got)
	}
}

// TestRedact: Config.Redact sees every message before the consumer does,
// so what it removes or masks is neither handed to the handler nor parked.
func TestRedact(t *testing.T) {
	t.Parallel()
	var handled []byte
	handler := func(_ context.Context, _ pgx.Tx, m *consumer.Message) error {
		handled = bytes.Clone(m.Value)
		return consumer.Permanent(errors.New("unknown event type"))
	}
	e := newEnv(t, webhook.Config{
		Headers: append(webhook.DefaultHeaders(), "X-Customer-Email"),
		Redact: func(m *consumer.Message) {
			m.Value = bytes.ReplaceAll(m.Value, []byte("4242424242424242"), []byte("################"))
			for i := range m.Headers {
				if m.Headers[i].Key == "X-Customer-Email" {
					m.Headers[i].Value = []byte("redacted")
				}
			}
		},
	}, consumer.Config{Handler: handler})
	e.start()
	body := []byte(`{"id":"evt_card","card":"4242424242424242"}`)
	if got := e.postWith(body, map[string]string{"X-Customer-Email": "jane@example.com"}); got != http.StatusOK {
		t.Fatalf("answered %d, want 200", got)
	}
	p := e.parked()
	if len(p) != 1 {
		t.Fatalf("%d parked rows, want 1", len(p))
	}
	if strings.Contains(string(p[0].Payload), "4242") || strings.Contains(string(handled), "4242") {
		t.Errorf("the card number reached the parked row %q or the handler %q", p[0].Payload, handled)
	}
	if deref(p[0].DedupeID) != "evt_card" {
		t.Errorf("parked under %q, want the ID of the body as signed", deref(p[0].DedupeID))
	}
	for _, h := range p[0].Headers {
		if h.Key == "X-Customer-Email" && string(h.Value) != "redacted" {
			t.Errorf("X-Customer-Email parked as %q", h.Value)
		}
	}
	if !hasHeader(p[0], "X-Customer-Email") {
		t.Errorf("the listed header X-Customer-Email was not kept: %v", p[0].Headers)
	}
}
