package bench_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/effectively-once/effectively/bench"
	"github.com/effectively-once/effectively/pgtest"
)

// TestHTTPLoad runs the HTTP benchmark's three handlers small: every
// request answered 201 and one row written per request, bare, with the
// hand-written key table (one key row per request) and under the
// middleware (which also stores one response per request).
func TestHTTPLoad(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	mw, err := bench.SetupHTTP(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []struct {
		name      string
		srv       *httptest.Server
		responses int
	}{
		{"bare", httptest.NewServer(bench.BareHandler(pool)), 0},
		{"hand-written", httptest.NewServer(bench.HandWrittenHandler(pool)), 200},
		{"middleware", httptest.NewServer(bench.IdempotentHandler(mw)), 200},
	} {
		defer v.srv.Close()
		if err := bench.ResetHTTP(ctx, pool); err != nil {
			t.Fatal(err)
		}
		if _, err := bench.LoadHTTP(ctx, v.srv.URL+"/payments", 4, 200, v.name); err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
		var rows, responses int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(DISTINCT key) FROM http_payments),
    (SELECT count(*) FROM effectively.idempotency_responses) + (SELECT count(*) FROM http_keys WHERE status = 201)`).Scan(&rows, &responses); err != nil {
			t.Fatal(err)
		}
		if rows != 200 || responses != v.responses {
			t.Errorf("%s: %d rows, %d responses; want 200, %d", v.name, rows, responses, v.responses)
		}
	}
}

// BenchmarkHTTPMiddleware reports requests per second through the
// middleware, 8 clients; cmd/httptable puts it beside the bare handler.
func BenchmarkHTTPMiddleware(b *testing.B) {
	pool := pgtest.NewPool(b)
	ctx := context.Background()
	mw, err := bench.SetupHTTP(ctx, pool)
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(bench.IdempotentHandler(mw))
	defer srv.Close()
	b.ResetTimer()
	d, err := bench.LoadHTTP(ctx, srv.URL+"/payments", 8, b.N, "b")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/d.Seconds(), "req/s")
}
