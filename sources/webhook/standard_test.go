package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/sources/webhook"
)

// The test vector of the Standard Webhooks specification's reference
// implementations (libraries/go/webhook_test.go, TestWebhookSign, and the
// other languages' equivalents).
const (
	swSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	swID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	swTimestamp = 1614265330
	swPayload   = `{"test": 2432232314}`
	swSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

// swSign signs as a Standard Webhooks sender does, computed here rather
// than by the package.
func swSign(secret, id string, ts int64, body string) string {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		panic(err)
	}
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "%s.%d.%s", id, ts, body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

func swRequest(id string, ts int64, sig, body string) *http.Request {
	r := request(body, "", "")
	if id != "" {
		r.Header.Set("webhook-id", id)
	}
	if ts != 0 {
		r.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	}
	if sig != "" {
		r.Header.Set("webhook-signature", sig)
	}
	return r
}

func swAt(t *testing.T, now int64, secrets ...string) *webhook.StandardVerifier {
	t.Helper()
	v, err := webhook.NewStandardVerifier(webhook.StandardConfig{Secrets: secrets, Now: func() time.Time { return time.Unix(now, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestStandardVectors(t *testing.T) {
	if got := swSign(swSecret, swID, swTimestamp, swPayload); got != swSignature {
		t.Fatalf("the test's own signer gives %s, the specification %s", got, swSignature)
	}
	const other = "whsec_" + "c2VjcmV0LWJlZm9yZS10aGUtcm90YXRpb24=" // base64("secret-before-the-rotation")
	oldSig := swSign(other, swID, swTimestamp, swPayload)
	cases := []struct {
		name    string
		secrets []string
		now     int64
		id      string
		ts      int64
		sig     string
		body    string
		want    error // nil: accepted
	}{
		{"the specification's vector", []string{swSecret}, swTimestamp, swID, swTimestamp, swSignature, swPayload, nil},
		{"the secret without whsec_", []string{strings.TrimPrefix(swSecret, "whsec_")}, swTimestamp, swID, swTimestamp, swSignature, swPayload, nil},
		{"within the tolerance", []string{swSecret}, swTimestamp + 299, swID, swTimestamp, swSignature, swPayload, nil},
		{"stale", []string{swSecret}, swTimestamp + 301, swID, swTimestamp, swSignature, swPayload, webhook.ErrStaleSignature},
		{"from the future", []string{swSecret}, swTimestamp - 301, swID, swTimestamp, swSignature, swPayload, webhook.ErrStaleSignature},
		// A rotation: the sender signs with the old and the new secret.
		{"rotation, receiver on the new secret", []string{swSecret}, swTimestamp, swID, swTimestamp, oldSig + " " + swSignature, swPayload, nil},
		{"rotation, receiver on the old secret", []string{other}, swTimestamp, swID, swTimestamp, oldSig + " " + swSignature, swPayload, nil},
		{"rotation, receiver on both", []string{other, swSecret}, swTimestamp, swID, swTimestamp, swSignature, swPayload, nil},
		{"other versions and junk ignored", []string{swSecret}, swTimestamp, swID, swTimestamp, "v1a,AAAA v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= v1,!!! " + swSignature, swPayload, nil},
		{"a secret rolled away", []string{other}, swTimestamp, swID, swTimestamp, swSignature, swPayload, webhook.ErrSignatureMismatch},
		{"another body", []string{swSecret}, swTimestamp, swID, swTimestamp, swSignature, `{"test": 2432232315}`, webhook.ErrSignatureMismatch},
		{"another ID", []string{swSecret}, swTimestamp, "msg_replayed", swTimestamp, swSignature, swPayload, webhook.ErrSignatureMismatch},
		{"another timestamp", []string{swSecret}, swTimestamp, swID, swTimestamp + 1, swSignature, swPayload, webhook.ErrSignatureMismatch},
		{"the reference's invalid signature", []string{swSecret}, swTimestamp, swID, swTimestamp, "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=", swPayload, webhook.ErrSignatureMismatch},
		{"no signature", []string{swSecret}, swTimestamp, swID, swTimestamp, "", swPayload, webhook.ErrNoSignature},
		{"no ID", []string{swSecret}, swTimestamp, "", swTimestamp, swSignature, swPayload, webhook.ErrMalformedSignature},
		{"no timestamp", []string{swSecret}, swTimestamp, swID, 0, swSignature, swPayload, webhook.ErrMalformedSignature},
		{"no v1 entry", []string{swSecret}, swTimestamp, swID, swTimestamp, "v1a,AAAA", swPayload, webhook.ErrMalformedSignature},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := swAt(t, c.now, c.secrets...).Verify(swRequest(c.id, c.ts, c.sig, c.body), []byte(c.body))
			if c.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, c.want) || !errors.Is(err, webhook.ErrSignature) {
				t.Fatalf("%v, want %v", err, c.want)
			}
		})
	}
	v := swAt(t, swTimestamp, swSecret)
	if id, err := v.SignedID(swRequest(swID, swTimestamp, swSignature, swPayload), []byte(swPayload)); err != nil || id != swID {
		t.Fatalf("SignedID %q, %v; want %s", id, err, swID)
	}
	ts := strconv.Itoa(swTimestamp)
	r := request(swPayload, "Svix-Id", swID)
	r.Header.Set("Svix-Timestamp", ts)
	r.Header.Set("Svix-Signature", swSignature)
	svix, err := webhook.NewStandardVerifier(webhook.StandardConfig{Secrets: []string{swSecret}, Prefix: "svix", Tolerance: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := svix.Verify(r, []byte(swPayload)); err != nil {
		t.Fatalf("Svix's header names: %v", err)
	}
	for _, bad := range [][]string{nil, {""}, {"whsec_not base64!"}} {
		if _, err := webhook.NewStandardVerifier(webhook.StandardConfig{Secrets: bad}); !errors.Is(err, pg.ErrInvalidConfig) {
			t.Errorf("secrets %q: %v, want a config error", bad, err)
		}
	}
}

// TestStandardDelivery: a Standard Webhooks sender's retries (the same
// webhook-id, a fresh timestamp and signature each) are duplicates, and a
// captured delivery cannot be sent again under another ID.
func TestStandardDelivery(t *testing.T) {
	t.Parallel()
	v, err := webhook.NewStandardVerifier(webhook.StandardConfig{Secrets: []string{swSecret}})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, webhook.Config{Verifier: v}, consumer.Config{})
	e.start()
	body := `{"type":"user.created","data":{"id":"user_29w83sxmDNGwOuEthce5gg56FcC"}}`
	post := func(id string, ts int64, sig string) int {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, e.srv.URL+"/hooks/clerk", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("webhook-id", id)
		req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
		req.Header.Set("webhook-signature", sig)
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	now := time.Now().Unix()
	for i := range 3 {
		ts := now - int64(i)
		if got := post("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", ts, swSign(swSecret, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", ts, body)); got != http.StatusOK {
			t.Fatalf("delivery %d: %d, want 200", i+1, got)
		}
	}
	if got := post("msg_replayed", now, swSign(swSecret, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", now, body)); got != http.StatusUnauthorized {
		t.Fatalf("a captured delivery under another ID: %d, want 401", got)
	}
	if got := post("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", now-600, swSign(swSecret, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", now-600, body)); got != http.StatusUnauthorized {
		t.Fatalf("a stale delivery: %d, want 401", got)
	}
	if counts := e.effectCounts(); len(counts) != 1 || counts["msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"] != 1 {
		t.Fatalf("effects %v, want msg_2KWPBgLlAfxdpx2AI54pPJ85f4W once", counts)
	}
	p := e.parked()
	if len(p) != 0 {
		t.Fatalf("%d parked rows", len(p))
	}
}
