package logx

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A failure is logged at Debug while its run is younger than After, then
// at Warn once per After; a success starts a new run.
func TestPersisting(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p := &Persisting{After: 50 * time.Millisecond}
	levels := func() string {
		var out []string
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			for _, l := range []string{"DEBUG", "WARN"} {
				if strings.Contains(line, "level="+l) {
					out = append(out, l)
				}
			}
		}
		buf.Reset()
		return strings.Join(out, " ")
	}
	err := errors.New("refused")
	p.Failed(log, "commit", err)
	p.Failed(log, "commit", err)
	if got := levels(); got != "DEBUG DEBUG" {
		t.Fatalf("a young run logged %q, want two DEBUG", got)
	}
	time.Sleep(60 * time.Millisecond) // the run's age is the subject under test
	p.Failed(log, "commit", err)
	p.Failed(log, "commit", err)
	if got := levels(); got != "WARN DEBUG" {
		t.Fatalf("a run older than After logged %q, want one WARN then DEBUG", got)
	}
	p.Succeeded()
	p.Failed(log, "commit", err)
	if got := levels(); got != "DEBUG" {
		t.Fatalf("after a success a failure logged %q, want DEBUG", got)
	}
}
