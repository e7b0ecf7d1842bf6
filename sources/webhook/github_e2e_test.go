package webhook_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/sources/webhook"
	"github.com/jackc/pgx/v5"
)

// TestGitHubDelivery: GitHub-style deliveries (the signature in
// X-Hub-Signature-256, the event named by a hash of the signed body, lanes
// by repository, a chosen subset of headers) reach the handler as messages
// with the fields the package documents, and a redelivery is a duplicate.
func TestGitHubDelivery(t *testing.T) {
	t.Parallel()
	const secret = "gh-secret"
	v, err := webhook.NewGitHubVerifier(webhook.GitHubConfig{Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []consumer.Message
	var refs []string
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		mu.Lock()
		seen = append(seen, *m)
		mu.Unlock()
		return insertEffect(ctx, tx, m)
	}
	e := newEnv(t, webhook.Config{
		Verifier: v,
		Headers:  []string{"x-github-event", "X-GitHub-Delivery"},
		Lane: func(r *http.Request, body []byte, id string) string {
			repo, _ := webhook.JSONField("repository", "full_name")(r, body)
			return "repo:" + repo
		},
	}, consumer.Config{Handler: handler, KeyFunc: func(m *consumer.Message) (dedupe.Key, error) {
		mu.Lock()
		refs = append(refs, m.Ref)
		mu.Unlock()
		return consumer.DefaultKey(m)
	}})
	e.start()

	body := []byte(`{"action":"opened","repository":{"full_name":"octo/hello"}}`)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	sig := "sha256=" + hex.EncodeToString(mac.Sum(nil))
	post := func(sig string) int {
		req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/hooks/github", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-GitHub-Event", "pull_request")
		req.Header.Set("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
		req.Header.Set("X-Hub-Signature-256", sig)
		req.Header.Set("Authorization", "Bearer not-for-the-parked-table")
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := post("sha256=" + strings.Repeat("0", 64)); got != http.StatusUnauthorized {
		t.Fatalf("a forged delivery: %d, want 401", got)
	}
	for i := range 2 {
		if got := post(sig); got != http.StatusOK {
			t.Fatalf("delivery %d: %d, want 200", i+1, got)
		}
	}
	if n := e.effects(webhook.BodyID(body)); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if st := e.hooks.Total(); st.Applied != 1 || st.Duplicate != 1 {
		t.Fatalf("consumer saw %v, want 1 applied and 1 duplicate", st)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Fatalf("the handler ran %d times, want 1", len(seen))
	}
	m := seen[0]
	if m.Source != "webhook" || m.ID != webhook.BodyID(body) || m.Lane != "repo:octo/hello" ||
		!bytes.Equal(m.Value, body) || m.Key != nil || m.Attempt != 1 || m.Time.IsZero() || m.Ref == "" {
		t.Fatalf("message %+v", m)
	}
	var names []string
	for _, h := range m.Headers {
		names = append(names, h.Key+"="+string(h.Value))
	}
	if got := strings.Join(names, " "); got != "X-Github-Event=pull_request X-Github-Delivery=72d3162e-cc78-11e3-81ab-4c9367dc0958" {
		t.Fatalf("headers %q, want the two chosen, in order", got)
	}
	// Every delivery of an event is the same message, with the same Ref:
	// its event ID.
	if len(refs) != 2 || refs[0] != webhook.BodyID(body) || refs[1] != refs[0] {
		t.Fatalf("Refs %q, want the event ID twice", refs)
	}
	e.mu.Lock()
	n := len(e.observed)
	e.mu.Unlock()
	if n != 3 {
		t.Fatalf("Observe saw %d requests, want 3", n)
	}
}

// githubSign returns an X-Hub-Signature-256 header for body, computed here
// rather than by the package.
func githubSign(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// postGitHub delivers body as GitHub does, with the given delivery ID
// (none when empty) and extra headers, and returns the status.
func (e *env) postGitHub(body []byte, sig, delivery string, extra ...string) int {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/hooks/github", bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-GitHub-Event", "push")
	req.Header.Set("X-Hub-Signature-256", sig)
	if delivery != "" {
		req.Header.Set("X-GitHub-Delivery", delivery)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Set(extra[i], extra[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestGitHubReplayNewDeliveryID: GitHub's signature covers the body and
// nothing else, so a captured delivery sent again with a delivery ID of
// the sender's choosing is the same signed event, and must be a
// duplicate: one effect, whether the source names events by default or
// was configured, as the documentation used to say, with
// Header("X-GitHub-Delivery").
func TestGitHubReplayNewDeliveryID(t *testing.T) {
	t.Parallel()
	const secret = "gh-secret"
	for name, id := range map[string]webhook.IDFunc{
		"default":           nil,
		"X-GitHub-Delivery": webhook.Header("X-GitHub-Delivery"),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			v, err := webhook.NewGitHubVerifier(webhook.GitHubConfig{Secrets: []string{secret}})
			if err != nil {
				t.Fatal(err)
			}
			e := newEnv(t, webhook.Config{Verifier: v, ID: id}, consumer.Config{})
			e.start()
			body := []byte(`{"ref":"refs/heads/main","after":"9f2c","repository":{"full_name":"octo/hello"}}`)
			sig := githubSign(secret, body)
			for i, delivery := range []string{"72d3162e-cc78-11e3-81ab-4c9367dc0958", "00000000-0000-0000-0000-000000000001", "replayed-with-a-made-up-id"} {
				if got := e.postGitHub(body, sig, delivery); got != http.StatusOK {
					t.Fatalf("delivery %d: %d, want 200", i+1, got)
				}
			}
			counts := e.effectCounts()
			total := 0
			for _, n := range counts {
				total += n
			}
			if total != 1 {
				t.Fatalf("one signed body sent with three delivery IDs made %d effects %v, want 1", total, counts)
			}
			if st := e.hooks.Total(); st.Applied != 1 || st.Duplicate != 2 {
				t.Fatalf("consumer saw %v, want 1 applied and 2 duplicates", st)
			}
			// Another body is another event.
			other := []byte(`{"ref":"refs/heads/main","after":"a0b1","repository":{"full_name":"octo/hello"}}`)
			if got := e.postGitHub(other, githubSign(secret, other), "72d3162e-cc78-11e3-81ab-4c9367dc0958"); got != http.StatusOK {
				t.Fatalf("another body: %d, want 200", got)
			}
			if n := len(e.effectCounts()); n != 2 {
				t.Fatalf("effects of %d events, want 2", n)
			}
		})
	}
}
