package webhook_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/sources/webhook"
)

// The signatures below were computed outside Go, with
//
//	printf '%s' "$payload" | openssl dgst -sha256 -hmac "$secret"
//
// and GitHub's from its documentation ("Validating webhook deliveries").
const (
	stripeBody      = `{"id":"evt_1","type":"payment_intent.succeeded"}`
	stripeT         = "1700000000"
	stripeSigNew    = "22d8dc182f5c588077683bd378368e29765bfe5df2560112b4f28fef120f0e31" // whsec_test_secret
	stripeSigOld    = "01fb11721f95aaf652cd381c2bb35f463528c395c86a34cbf41d7a1b45b2ae9d" // whsec_old_secret
	githubSecret    = "It's a Secret to Everybody"
	githubBody      = "Hello, World!"
	githubSignature = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
)

func request(body string, header, value string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/hook", strings.NewReader(body))
	if header != "" {
		r.Header.Set(header, value)
	}
	return r
}

func stripeAt(t *testing.T, now time.Time, secrets ...string) *webhook.StripeVerifier {
	t.Helper()
	v, err := webhook.NewStripeVerifier(webhook.StripeConfig{Secrets: secrets, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestStripeVectors(t *testing.T) {
	signed := time.Unix(1700000000, 0)
	cases := []struct {
		name    string
		secrets []string
		now     time.Time
		header  string
		body    string
		want    error // nil: accepted
	}{
		{"valid", []string{"whsec_test_secret"}, signed, "t=" + stripeT + ",v1=" + stripeSigNew, stripeBody, nil},
		{"spaces and a v0", []string{"whsec_test_secret"}, signed, "t=" + stripeT + ", v0=abc, v1=" + stripeSigNew, stripeBody, nil},
		{"second of two v1", []string{"whsec_test_secret"}, signed, "t=" + stripeT + ",v1=" + stripeSigOld + ",v1=" + stripeSigNew, stripeBody, nil},
		{"old secret still listed", []string{"whsec_test_secret", "whsec_old_secret"}, signed, "t=" + stripeT + ",v1=" + stripeSigOld, stripeBody, nil},
		{"old secret dropped", []string{"whsec_test_secret"}, signed, "t=" + stripeT + ",v1=" + stripeSigOld, stripeBody, webhook.ErrSignatureMismatch},
		{"body changed", []string{"whsec_test_secret"}, signed, "t=" + stripeT + ",v1=" + stripeSigNew, strings.Replace(stripeBody, "evt_1", "evt_2", 1), webhook.ErrSignatureMismatch},
		{"timestamp changed", []string{"whsec_test_secret"}, signed, "t=1700000001,v1=" + stripeSigNew, stripeBody, webhook.ErrSignatureMismatch},
		{"not hex", []string{"whsec_test_secret"}, signed, "t=" + stripeT + ",v1=zz" + stripeSigNew[2:], stripeBody, webhook.ErrSignatureMismatch},
		{"truncated", []string{"whsec_test_secret"}, signed, "t=" + stripeT + ",v1=" + stripeSigNew[:62], stripeBody, webhook.ErrSignatureMismatch},
		{"within tolerance", []string{"whsec_test_secret"}, signed.Add(299 * time.Second), "t=" + stripeT + ",v1=" + stripeSigNew, stripeBody, nil},
		{"stale", []string{"whsec_test_secret"}, signed.Add(301 * time.Second), "t=" + stripeT + ",v1=" + stripeSigNew, stripeBody, webhook.ErrStaleSignature},
		{"from the future", []string{"whsec_test_secret"}, signed.Add(-301 * time.Second), "t=" + stripeT + ",v1=" + stripeSigNew, stripeBody, webhook.ErrStaleSignature},
		{"no header", []string{"whsec_test_secret"}, signed, "", stripeBody, webhook.ErrNoSignature},
		{"no v1", []string{"whsec_test_secret"}, signed, "t=" + stripeT + ",v0=" + stripeSigNew, stripeBody, webhook.ErrMalformedSignature},
		{"no t", []string{"whsec_test_secret"}, signed, "v1=" + stripeSigNew, stripeBody, webhook.ErrMalformedSignature},
		{"t not a number", []string{"whsec_test_secret"}, signed, "t=soon,v1=" + stripeSigNew, stripeBody, webhook.ErrMalformedSignature},
		{"two t", []string{"whsec_test_secret"}, signed, "t=" + stripeT + ",t=1,v1=" + stripeSigNew, stripeBody, webhook.ErrMalformedSignature},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			header := ""
			if c.header != "" {
				header = "Stripe-Signature"
			}
			err := stripeAt(t, c.now, c.secrets...).Verify(request(c.body, header, c.header), []byte(c.body))
			switch {
			case c.want == nil && err != nil:
				t.Fatalf("Verify: %v, want it accepted", err)
			case c.want != nil && !errors.Is(err, c.want):
				t.Fatalf("Verify: %v, want %v", err, c.want)
			case c.want != nil && !errors.Is(err, webhook.ErrSignature):
				t.Fatalf("Verify: %v does not match ErrSignature", err)
			}
		})
	}
}

func TestStripeToleranceOff(t *testing.T) {
	v, err := webhook.NewStripeVerifier(webhook.StripeConfig{Secrets: []string{"whsec_test_secret"}, Tolerance: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(request(stripeBody, "Stripe-Signature", "t="+stripeT+",v1="+stripeSigNew), []byte(stripeBody)); err != nil {
		t.Fatalf("a signature from 2023 with the tolerance off: %v", err)
	}
}

func TestGitHubVectors(t *testing.T) {
	v, err := webhook.NewGitHubVerifier(webhook.GitHubConfig{Secrets: []string{"new secret", githubSecret}})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, header, body string
		want               error
	}{
		{"GitHub's documented vector", githubSignature, githubBody, nil},
		{"body changed", githubSignature, githubBody + " ", webhook.ErrSignatureMismatch},
		{"upper-case hex", "sha256=" + strings.ToUpper(githubSignature[7:]), githubBody, nil},
		{"sha1 scheme", "sha1=" + githubSignature[7:], githubBody, webhook.ErrMalformedSignature},
		{"no header", "", githubBody, webhook.ErrNoSignature},
		{"empty signature", "sha256=", githubBody, webhook.ErrSignatureMismatch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			header := ""
			if c.header != "" {
				header = "X-Hub-Signature-256"
			}
			err := v.Verify(request(c.body, header, c.header), []byte(c.body))
			if c.want == nil && err != nil {
				t.Fatalf("Verify: %v, want it accepted", err)
			}
			if c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("Verify: %v, want %v", err, c.want)
			}
		})
	}
	only, err := webhook.NewGitHubVerifier(webhook.GitHubConfig{Secrets: []string{"new secret"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := only.Verify(request(githubBody, "X-Hub-Signature-256", githubSignature), []byte(githubBody)); !errors.Is(err, webhook.ErrSignatureMismatch) {
		t.Fatalf("a secret rolled away: %v, want ErrSignatureMismatch", err)
	}
}

func TestVerifierConfig(t *testing.T) {
	if _, err := webhook.NewStripeVerifier(webhook.StripeConfig{}); !errors.Is(err, pg.ErrInvalidConfig) {
		t.Errorf("no secrets: %v, want a config error", err)
	}
	if _, err := webhook.NewGitHubVerifier(webhook.GitHubConfig{Secrets: []string{"a", ""}}); !errors.Is(err, pg.ErrInvalidConfig) {
		t.Errorf("an empty secret: %v, want a config error", err)
	}
}

func TestIDFuncs(t *testing.T) {
	cases := []struct {
		name string
		fn   webhook.IDFunc
		body string
		hdr  string
		want string // "" : an error
	}{
		{"top-level string", webhook.JSONField("id"), `{"id":"evt_9","x":1}`, "", "evt_9"},
		{"nested", webhook.JSONField("data", "object", "id"), `{"data":{"object":{"id":"pi_1"}}}`, "", "pi_1"},
		{"number", webhook.JSONField("id"), `{"id": 12345678901234567890}`, "", "12345678901234567890"},
		{"missing", webhook.JSONField("id"), `{"ID":"x"}`, "", ""},
		{"empty", webhook.JSONField("id"), `{"id":""}`, "", ""},
		{"null", webhook.JSONField("id"), `{"id":null}`, "", ""},
		{"object", webhook.JSONField("id"), `{"id":{}}`, "", ""},
		{"not JSON", webhook.JSONField("id"), `id=evt_1`, "", ""},
		{"no path", webhook.JSONField(), `{"id":"x"}`, "", ""},
		{"header", webhook.Header("X-GitHub-Delivery"), `{}`, "72d3162e-cc78-11e3-81ab-4c9367dc0958", "72d3162e-cc78-11e3-81ab-4c9367dc0958"},
		{"header missing", webhook.Header("X-GitHub-Delivery"), `{}`, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := request(c.body, "", "")
			if c.hdr != "" {
				r.Header.Set("X-GitHub-Delivery", c.hdr)
			}
			got, err := c.fn(r, []byte(c.body))
			if c.want == "" {
				if err == nil {
					t.Fatalf("got %q, want an error", got)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
		})
	}
}
