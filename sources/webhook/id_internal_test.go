package webhook

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestEventIDSignedView: with a SignedIDVerifier, Config.ID names the event
// when it can from what the signature covers (the body, the signed
// headers), and the verifier's SignedID does when it reads anything else
// (an unsigned header, the query string).
func TestEventIDSignedView(t *testing.T) {
	gh, err := NewGitHubVerifier(GitHubConfig{Secrets: []string{"s"}})
	if err != nil {
		t.Fatal(err)
	}
	sw, err := NewStandardVerifier(StandardConfig{Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}})
	if err != nil {
		t.Fatal(err)
	}
	query := func(r *http.Request, _ []byte) (string, error) { return r.URL.Query().Get("id"), nil }
	body := `{"delivery":{"id":"d_1"}}`
	cases := []struct {
		name string
		v    Verifier
		id   IDFunc
		want string
	}{
		{"GitHub, no ID", gh, nil, BodyID([]byte(body))},
		{"GitHub, the signed body", gh, JSONField("delivery", "id"), "d_1"},
		{"GitHub, an unsigned header", gh, Header("X-GitHub-Delivery"), BodyID([]byte(body))},
		{"GitHub, the query string", gh, query, BodyID([]byte(body))},
		{"Standard, no ID", sw, nil, "msg_1"},
		{"Standard, the signed webhook-id", sw, Header("Webhook-Id"), "msg_1"},
		{"Standard, an unsigned header", sw, Header("X-Request-Id"), "msg_1"},
		{"Unverified, an unsigned header", Unverified(), Header("X-Request-Id"), "req_1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := New(Config{Verifier: c.v, ID: c.id, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			r := httptest.NewRequest(http.MethodPost, "/hook?id=q_1", strings.NewReader(body))
			r.Header.Set("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
			r.Header.Set("X-Request-Id", "req_1")
			r.Header.Set("Webhook-Id", "msg_1")
			got, err := s.eventID(r, []byte(body))
			if err != nil || got != c.want {
				t.Fatalf("event ID %q, %v; want %q", got, err, c.want)
			}
			if r.Header.Get("X-Request-Id") != "req_1" || r.URL.RawQuery != "id=q_1" {
				t.Fatal("the request itself was changed")
			}
		})
	}
}
