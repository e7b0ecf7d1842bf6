package chaostest

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// WorkerThatCannotStart checks that a worker of h that fails before it is
// ready (here: no database to migrate) makes startProc return at once with
// the worker's own error, instead of the run waiting for it.
func WorkerThatCannotStart(t *testing.T, h Harness) {
	if testing.Short() {
		t.Skip("builds the worker program: skipped with -short")
	}
	_, worker := buildBinaries(t, t.TempDir(), h.Worker, false)
	start := time.Now()
	_, _, err := startProc(t, "w-bad", t.TempDir(), 2*time.Minute, worker,
		"-brokers", "127.0.0.1:1", "-db", "postgres://nobody@/nowhere?host=/nonexistent&connect_timeout=5", "-topics", "t", "-exit-with-stdin")
	if !errors.Is(err, errNotReady) {
		t.Fatalf("startProc: got %v, want an error wrapping errNotReady", err)
	}
	if !strings.Contains(err.Error(), "exited before it was ready") || !strings.Contains(err.Error(), "worker failed") {
		t.Errorf("the error does not say that the worker exited and why: %v", err)
	}
	t.Logf("startProc: %v", err)
	if d := time.Since(start); d > time.Minute {
		t.Errorf("startProc took %s to notice the worker's exit", d)
	}
}
