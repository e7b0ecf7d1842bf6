// Package childtest runs a test of the current test binary in a child
// process, for tests that must kill, stop or continue a real process (a
// crash is a SIGKILL, a frozen worker a SIGSTOP), and reads the lines the
// child prints to tell the parent where it is.
package childtest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Child is a running child process of the test binary.
type Child struct {
	t     testing.TB
	Cmd   *exec.Cmd
	Stdin io.WriteCloser
	lines chan string
}

// Start runs the test named test (a -test.run pattern is built from it) in
// a child process with env added to this process's environment. The child
// is killed at the end of the test if it still runs.
func Start(t testing.TB, test string, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := &Child{t: t, Cmd: cmd, Stdin: stdin, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	return c
}

// Expect waits for the child's next line that starts with prefix, skipping
// others, and returns the rest of it. It fails the test when the child
// exits first, or after two minutes, which only bounds a hung child.
func (c *Child) Expect(prefix string) string {
	c.t.Helper()
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("the child process exited before %q", prefix)
			}
			if rest, ok := strings.CutPrefix(l, prefix); ok {
				return rest
			}
		case <-timeout:
			c.t.Fatalf("timed out waiting for the child process's %q", prefix)
		}
	}
}

// Freeze stops the child with SIGSTOP and returns once the kernel reports
// it stopped (state T in /proc), so that it runs no further instruction.
// It may be called from any goroutine.
func (c *Child) Freeze() error {
	if err := c.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	stat := fmt.Sprintf("/proc/%d/stat", c.Cmd.Process.Pid)
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := os.ReadFile(stat)
		if err != nil {
			return err
		}
		// pid (comm) state ...: the state follows the last ')'.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'T' {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the child process did not stop: %s", b)
		}
		time.Sleep(time.Millisecond)
	}
}

// Thaw continues the child after Freeze (SIGCONT).
func (c *Child) Thaw() {
	c.t.Helper()
	if err := c.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		c.t.Fatal(err)
	}
}
