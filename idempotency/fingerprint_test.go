package idempotency_test

import (
	"bytes"
	"testing"

	"github.com/effectively-once/effectively/idempotency"
)

func TestFingerprintVectors(t *testing.T) {
	t.Parallel()
	fp := func(method, path, query, ct, body string) []byte {
		t.Helper()
		b, err := idempotency.Fingerprint(method, path, query, ct, []byte(body))
		if err != nil {
			t.Fatalf("Fingerprint(%s): %v", body, err)
		}
		return b
	}
	base := fp("POST", "/payments", "", "application/json", `{"amount":500,"to":"acct_9"}`)
	same := []struct{ name, ct, body string }{
		{"reordered, spaced", "application/json", `{ "to": "acct_9", "amount": 500 }`},
		{"newlines and tabs", "application/json; charset=utf-8", "{\n\t\"amount\" : 500,\n\t\"to\" : \"acct_9\"\n}\n"},
		{"+json type", "application/vnd.api+json", `{"to":"acct_9","amount":500}`},
	}
	for _, c := range same {
		if got := fp("POST", "/payments", "", c.ct, c.body); !bytes.Equal(got, base) {
			t.Errorf("%s: fingerprint differs from the compact form", c.name)
		}
	}
	differ := []struct{ name, method, path, query, ct, body string }{
		{"changed amount", "POST", "/payments", "", "application/json", `{"amount":501,"to":"acct_9"}`},
		{"amount as string", "POST", "/payments", "", "application/json", `{"amount":"500","to":"acct_9"}`},
		{"amount 500.0", "POST", "/payments", "", "application/json", `{"amount":500.0,"to":"acct_9"}`},
		{"changed recipient", "POST", "/payments", "", "application/json", `{"amount":500,"to":"acct_8"}`},
		{"other method", "PUT", "/payments", "", "application/json", `{"amount":500,"to":"acct_9"}`},
		{"other path", "POST", "/refunds", "", "application/json", `{"amount":500,"to":"acct_9"}`},
		{"a query", "POST", "/payments", "dry=1", "application/json", `{"amount":500,"to":"acct_9"}`},
		{"not JSON: raw bytes", "POST", "/payments", "", "text/plain", `{ "to": "acct_9", "amount": 500 }`},
	}
	for _, c := range differ {
		if got := fp(c.method, c.path, c.query, c.ct, c.body); bytes.Equal(got, base) {
			t.Errorf("%s: same fingerprint as the original", c.name)
		}
	}
	// Parts do not run together.
	if bytes.Equal(fp("POST", "/a", "b", "", ""), fp("POST", "/ab", "", "", "")) {
		t.Error("path and query ran together")
	}
	for _, bad := range []string{`{"amount":500,`, `{"a":1,"a":2}`, `{"a":1} {"b":2}`} {
		if _, err := idempotency.Fingerprint("POST", "/payments", "", "application/json", []byte(bad)); err == nil {
			t.Errorf("Fingerprint(%s): no error for malformed JSON", bad)
		}
	}
}
