package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/effectively-once/effectively/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestRunServesMetrics runs the example for a few seconds on a free port
// and checks the summary it scraped from its own /metrics endpoint.
func TestRunServesMetrics(t *testing.T) {
	t.Setenv("DATABASE_URL", pgtest.URL(t))
	var out bytes.Buffer
	var addr string
	err := run(context.Background(), options{listen: "127.0.0.1:0", rate: 400, duration: 3 * time.Second, out: &out, ready: func(a string) { addr = a }})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if addr == "" {
		t.Fatal("the metrics address was never reported")
	}
	applied := regexp.MustCompile(`effectively_messages_total\{consumer="metrics-example",outcome="applied"\} (\d+)`).FindStringSubmatch(out.String())
	if applied == nil {
		t.Fatalf("no applied counter in the output:\n%s", out.String())
	}
	if n, _ := strconv.Atoi(applied[1]); n == 0 {
		t.Errorf("nothing applied:\n%s", out.String())
	}
	for _, want := range []string{`effectively_lag_messages{consumer="metrics-example",lane="all"}`, `effectively_batch_size_count{consumer="metrics-example"}`} {
		if !bytes.Contains(out.Bytes(), []byte(want)) {
			t.Errorf("output lacks %s", want)
		}
	}
}
