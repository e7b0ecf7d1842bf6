package pgtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ownerFile, in a cluster's data directory, holds the ID of the process
// that started the cluster. A process that dies without stopping its
// cluster (killed, or a test binary that hit its -timeout) leaves the
// server running; the next Start in any process stops and removes such
// orphans, so that they do not pile up on a developer's machine.
const ownerFile = "pgtest.owner"

var reapOnce sync.Once

// writeOwner records this process as the owner of the cluster in dir.
func writeOwner(dir string) error {
	return os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644)
}

// reapOrphans stops and removes the clusters under os.TempDir() whose owner
// process is gone. A directory without an owner file (a cluster starting,
// or one made by an older version) is left alone, and so is one whose
// owner is alive or cannot be checked.
func reapOrphans(pgCtl string, logf func(string, ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "pgtest-*"))
	for _, dir := range dirs {
		if !orphaned(dir) {
			continue
		}
		c := &Cluster{dir: dir, pgCtl: pgCtl, logf: logf, asUser: ownerOf(dir)}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = c.command(ctx, pgCtl, "-D", dir, "-m", "immediate", "stop").Run() // not running: nothing to stop
		cancel()
		if err := os.RemoveAll(dir); err == nil {
			logf("pgtest: removed the cluster in %s, whose process had died without stopping it", dir)
		}
	}
}

// orphaned reports whether dir is a cluster whose owner process is gone.
// It assumes the processes that share the temporary directory share a PID
// namespace, as the tests of one machine or container do.
func orphaned(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return false
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// ownerOf returns the user a cluster's server runs as when this process is
// root (the owner of its data directory), or "" to run pg_ctl as this
// process's user.
func ownerOf(dir string) string {
	if os.Geteuid() != 0 {
		return ""
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return ""
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
		return "postgres"
	}
	return ""
}
