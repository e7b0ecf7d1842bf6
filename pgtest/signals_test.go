package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/childtest"
)

// TestInterruptStopsServers: a process that started a cluster and a
// PgBouncer and is sent SIGINT or SIGTERM stops both and removes their
// directories before it exits, with the status the signal would have
// given it.
func TestInterruptStopsServers(t *testing.T) {
	if _, err := findBouncer(); err != nil {
		t.Skip(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			child := childtest.Start(t, "TestInterruptChild", "PGTEST_INTERRUPT_CHILD=1")
			dir := child.Expect("DIR ")
			bouncerDir := child.Expect("BOUNCER ")
			pid := serverPID(t, dir)
			if err := child.Cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			err := child.Cmd.Wait()
			var ee *exec.ExitError
			want := 128 + int(sig)
			if !errors.As(err, &ee) || ee.ExitCode() != want {
				t.Errorf("the child ended with %v, want exit status %d", err, want)
			}
			for _, d := range []string{dir, bouncerDir} {
				if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s is still there after the signal: %v", d, err)
				}
			}
			for deadline := time.Now().Add(time.Minute); !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH); {
				if time.Now().After(deadline) {
					t.Fatalf("server %d still runs a minute after the signal", pid)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// serverPID reads the postmaster's process ID from the cluster in dir.
func serverPID(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestInterruptChild starts a cluster and a PgBouncer in front of it, says
// where, and waits for a signal; it runs only when TestInterruptStopsServers
// starts it.
func TestInterruptChild(t *testing.T) {
	if os.Getenv("PGTEST_INTERRUPT_CHILD") == "" {
		t.Skip("run by TestInterruptStopsServers")
	}
	ctx := context.Background()
	c, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := StartBouncer(ctx, c.URL(), BouncerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("DIR " + c.dir)
	fmt.Println("BOUNCER " + b.dir)
	select {}
}
