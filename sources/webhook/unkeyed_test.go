package webhook_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/sources/webhook"
)

// TestUnkeyedRepeatsParkOnce: a verified delivery whose event ID cannot be
// derived is parked whole (invalid_key), and the same signed body sent
// again and again, with other unsigned headers or signed anew, is the same
// message: it leaves one parked row that counts the repeats, so a captured
// delivery cannot fill the parked table. A different body is a message of
// its own, with a row of its own.
func TestUnkeyedRepeatsParkOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, webhook.Config{}, consumer.Config{})
	e.start()
	body := []byte(`{"type":"ping","data":{"n":1}}`)
	sig := stripeSign(testSecret, time.Now(), body)
	const n = 6
	for i := range n {
		extra := map[string]string{"User-Agent": fmt.Sprintf("replayer/%d", i), "Content-Type": fmt.Sprintf("application/x-%d", i)}
		if i%2 == 1 {
			// Signed anew, as the provider's own retry would be.
			sig = stripeSign(testSecret, time.Now().Add(time.Duration(i)*time.Second), body)
		}
		req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/hooks/stripe", bytesReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Stripe-Signature", sig)
		for k, v := range extra {
			req.Header.Set(k, v)
		}
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("delivery %d: %d, want 200", i+1, resp.StatusCode)
		}
	}
	// And many at once, some of them in one batch.
	const conc = 8
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			if r := e.postSigned(body, sig); r.status != http.StatusOK {
				t.Errorf("a concurrent repeat: %d %q, want 200", r.status, r.body)
			}
		})
	}
	wg.Wait()
	p := e.parked()
	if len(p) != 1 {
		t.Fatalf("%d repeats of one signed body left %d parked rows, want 1", n+conc, len(p))
	}
	if p[0].Reason != parked.ReasonInvalidKey || p[0].ParkCount != n+conc || string(p[0].Payload) != string(body) {
		t.Fatalf("parked %+v; want the body, reason invalid_key, parked %d times", p[0], n+conc)
	}
	if p[0].Ref != webhook.BodyID(body) {
		t.Errorf("parked under Ref %q, want %q", p[0].Ref, webhook.BodyID(body))
	}
	other := []byte(`{"type":"ping","data":{"n":2}}`)
	expectStatus(t, "another body", e.post(other), http.StatusOK)
	if p := e.parked(); len(p) != 2 {
		t.Fatalf("two bodies left %d parked rows, want 2", len(p))
	}
}

// TestGitHubWithoutDeliveryID: GitHub deliveries are named by their signed
// body, so one sent again and again without its X-GitHub-Delivery header
// (as a source configured with Header("X-GitHub-Delivery") used to park
// under a fresh row each time) is applied once and then a duplicate.
func TestGitHubWithoutDeliveryID(t *testing.T) {
	t.Parallel()
	const secret = "gh-secret"
	v, err := webhook.NewGitHubVerifier(webhook.GitHubConfig{Secrets: []string{secret}})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, webhook.Config{Verifier: v, ID: webhook.Header("X-GitHub-Delivery")}, consumer.Config{})
	e.start()
	body := []byte(`{"zen":"Keep it logically awesome.","hook_id":42}`)
	sig := githubSign(secret, body)
	for i := range 5 {
		if got := e.postGitHub(body, sig, "", "User-Agent", fmt.Sprintf("replayer/%d", i)); got != http.StatusOK {
			t.Fatalf("delivery %d: %d, want 200", i+1, got)
		}
	}
	if p := e.parked(); len(p) != 0 {
		t.Fatalf("%d parked rows, want none", len(p))
	}
	if n := e.effects(webhook.BodyID(body)); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if st := e.hooks.Total(); st.Applied != 1 || st.Duplicate != 4 {
		t.Fatalf("consumer saw %v, want 1 applied and 4 duplicates", st)
	}
}
