package effotel_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/tracing/effotel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestHTTPServerSpan: a request through the Idempotency-Key middleware is
// traced as an HTTP server span: named by method and route, with the HTTP
// convention's method, route and status attributes and whether it was a
// replay; a 4xx leaves the status unset, a 5xx is an error.
func TestHTTPServerSpan(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	mw, err := idempotency.New(pool, idempotency.Config{SingleTenant: true, Logger: slog.New(slog.DiscardHandler),
		Hooks: []consumer.Hook{effotel.New(effotel.Options{TracerProvider: tp})}})
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /accounts/{id}/payments", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(string(must(t, r)), "fail") {
			http.Error(w, "failed", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"ok":true}`)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	post := func(key, body string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/accounts/a1/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	want := []struct {
		status   int
		replayed bool
		failed   bool
	}{{201, false, false}, {201, true, false}, {422, false, false}, {500, false, true}}
	post("k1", `{"a":1}`)
	post("k1", `{"a":1}`)
	post("k1", `{"a":2}`)
	post("k2", `{"fail":1}`)
	spans := rec.Ended()
	if len(spans) != len(want) {
		t.Fatalf("%d spans, want %d", len(spans), len(want))
	}
	for i, s := range spans {
		attrs := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			attrs[kv.Key] = kv.Value
		}
		if s.Name() != "POST /accounts/{id}/payments" || s.SpanKind() != trace.SpanKindServer {
			t.Errorf("span %d: %q of kind %v, want \"POST /accounts/{id}/payments\" of kind server", i, s.Name(), s.SpanKind())
		}
		if attrs[effotel.AttrHTTPMethod].AsString() != "POST" || attrs[effotel.AttrHTTPRoute].AsString() != "/accounts/{id}/payments" ||
			attrs[effotel.AttrURLPath].AsString() != "/accounts/a1/payments" {
			t.Errorf("span %d: method %v, route %v, path %v", i, attrs[effotel.AttrHTTPMethod], attrs[effotel.AttrHTTPRoute], attrs[effotel.AttrURLPath])
		}
		if got := attrs[effotel.AttrHTTPStatusCode].AsInt64(); got != int64(want[i].status) {
			t.Errorf("span %d: status code %d, want %d", i, got, want[i].status)
		}
		if got := attrs[effotel.AttrReplayed].AsBool(); got != want[i].replayed {
			t.Errorf("span %d: replayed %v, want %v", i, got, want[i].replayed)
		}
		if failed := s.Status().Code == codes.Error; failed != want[i].failed {
			t.Errorf("span %d: status %v, want error %v", i, s.Status(), want[i].failed)
		}
	}
}

func must(t *testing.T, r *http.Request) []byte {
	t.Helper()
	b := make([]byte, 64)
	n, _ := r.Body.Read(b)
	return b[:n]
}
