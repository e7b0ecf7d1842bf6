package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/pgtest"
)

// TestDemoSoak runs the README's demo, built as a program, DEMO_SOAK_RUNS
// times in a row (make demo-soak), taking turns on its three set-ups: a
// throwaway server of its own, an existing server named by DATABASE_URL,
// and that server through PgBouncer in transaction pooling with the
// setting the docs give (default_query_exec_mode=exec). Every run must end
// with status 0 and its OK line within its bound. It is skipped unless
// DEMO_SOAK_RUNS is set.
func TestDemoSoak(t *testing.T) {
	runs, _ := strconv.Atoi(os.Getenv("DEMO_SOAK_RUNS"))
	if runs <= 0 {
		t.Skip("set DEMO_SOAK_RUNS (make demo-soak)")
	}
	transfers := os.Getenv("DEMO_SOAK_TRANSFERS") // the demo's default when unset
	bin := filepath.Join(t.TempDir(), "quickstart")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx := context.Background()
	server, err := pgtest.Start(ctx, pgtest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Stop() })
	direct, err := server.CreateDatabase(ctx, "demo")
	if err != nil {
		t.Fatal(err)
	}
	bouncer, err := pgtest.StartBouncer(ctx, server.URL(), pgtest.BouncerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bouncer.Stop() })
	setups := []struct{ name, url string }{
		{"throwaway server", ""},
		{"DATABASE_URL", direct},
		{"PgBouncer", bouncer.URL(direct) + "&default_query_exec_mode=exec"},
	}
	const bound = 5 * time.Minute // the demo's own -timeout is shorter
	var took []time.Duration
	for i := range runs {
		s := setups[i%len(setups)]
		args := []string{"-timeout", "4m"}
		if transfers != "" {
			args = append(args, "-transfers", transfers)
		}
		rctx, cancel := context.WithTimeout(ctx, bound)
		cmd := exec.CommandContext(rctx, bin, args...)
		cmd.Env = append(os.Environ(), "DATABASE_URL="+s.url)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err := cmd.Run()
		cancel()
		d := time.Since(start)
		took = append(took, d)
		if err != nil || !strings.Contains(out.String(), "\nOK: ") {
			t.Fatalf("run %d of %d (%s) failed after %s: %v\n%s", i+1, runs, s.name, d.Round(time.Millisecond), err, tail(out.String(), 30))
		}
		t.Logf("run %d of %d (%s): OK in %s", i+1, runs, s.name, d.Round(time.Millisecond))
	}
	slowest := time.Duration(0)
	for _, d := range took {
		slowest = max(slowest, d)
	}
	fmt.Printf("demo-soak: %d of %d runs OK, the slowest in %s\n", runs, runs, slowest.Round(time.Millisecond))
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
