package idempotency_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"

	"github.com/effectively-once/effectively/idempotency"
)

// latin1 is a Content-Disposition value with obs-text (RFC 9110 allows
// bytes 0x80-0xFF in a field value): "café.pdf" in ISO-8859-1.
const latin1 = "attachment; filename=\"caf\xe9.pdf\""

// TestHeaderBytesExact: a stored header whose value is not UTF-8 is stored
// and replayed byte for byte.
func TestHeaderBytesExact(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true, Headers: []string{"Content-Disposition"}},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Disposition", latin1)
			paymentsHandler(w, r)
		}))
	body := `{"amount":5,"to":"x"}`
	first := e.post(t, "k1", body)
	wantStatus(t, first, http.StatusCreated)
	if got := first.header.Get("Content-Disposition"); got != latin1 {
		t.Fatalf("first Content-Disposition %q, want %q", got, latin1)
	}
	again := e.post(t, "k1", body)
	wantStatus(t, again, http.StatusCreated)
	if got := again.header.Get("Content-Disposition"); got != latin1 || !bytes.Equal(again.body, first.body) {
		t.Fatalf("replayed Content-Disposition %q body %s, want %q %s", got, again.body, latin1, first.body)
	}
}

// TestHeadersStoredBeforeUpgrade: a response stored by a version that kept
// header values as text (the headers column) is replayed with them.
func TestHeadersStoredBeforeUpgrade(t *testing.T) {
	t.Parallel()
	e := newEnv(t, idempotency.Config{SingleTenant: true}, nil)
	fp, err := idempotency.Fingerprint(http.MethodPost, "/payments", "", "application/json", []byte(`{"amount":5,"to":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	migrateMarkers(t, e.pool)
	if _, err := e.pool.Exec(ctx, `INSERT INTO effectively.processed (scope, id, fingerprint) VALUES ($1, 'old', $2)`, idempotency.DefaultName, fp); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO effectively.idempotency_responses (scope, key, fingerprint, status, headers, body)
VALUES ($1, 'old', $2, 201, ARRAY['Content-Type', 'application/json', 'Location', '/payments/7'], '{"id":7}')`, idempotency.DefaultName, fp); err != nil {
		t.Fatal(err)
	}
	r := e.post(t, "old", `{"amount":5,"to":"x"}`)
	wantStatus(t, r, http.StatusCreated)
	if r.header.Get("Location") != "/payments/7" || r.header.Get("Content-Type") != "application/json" || string(r.body) != `{"id":7}` {
		t.Fatalf("old row replayed as %v %s", r.header, r.body)
	}
}
