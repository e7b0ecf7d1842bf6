package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/childtest"
)

// TestOrphanedClusterIsReaped: a process that starts a cluster and is
// killed leaves the server running; the next Start's sweep stops it and
// removes its directory.
func TestOrphanedClusterIsReaped(t *testing.T) {
	child := childtest.Start(t, "TestOrphanChild", "PGTEST_ORPHAN_CHILD=1")
	dir := child.Expect("DIR ")
	if err := child.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Cmd.Wait()
	b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		t.Fatalf("the killed process's server: %v", err)
	}
	pid, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the killed process's server %d is not running: %v", pid, err)
	}
	if !orphaned(dir) {
		t.Fatalf("%s is not taken for an orphan", dir)
	}

	_, pgCtl, err := findBinaries()
	if err != nil {
		t.Fatal(err)
	}
	reapOrphans(pgCtl, t.Logf)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s is still there after the sweep: %v", dir, err)
	}
	// pg_ctl returned once the server removed its pid file; the process
	// itself is gone once its parent (init, since its starter died) reaped
	// it.
	for deadline := time.Now().Add(time.Minute); !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH); {
		if time.Now().After(deadline) {
			t.Fatalf("server %d still runs a minute after the sweep", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestOrphanChild starts a cluster, says where, and waits to be killed;
// it runs only when TestOrphanedClusterIsReaped starts it.
func TestOrphanChild(t *testing.T) {
	if os.Getenv("PGTEST_ORPHAN_CHILD") == "" {
		t.Skip("run by TestOrphanedClusterIsReaped")
	}
	c, err := Start(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("DIR " + c.dir)
	select {}
}
