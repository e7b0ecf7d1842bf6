package chaostest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/effectively-once/effectively/integration/chaos"
)

// buildBinaries builds the broker program and the worker program
// workerPkg (an import path) into dir. With race the worker is built with
// the race detector (CHAOS_WORKER_RACE=1).
func buildBinaries(t *testing.T, dir, workerPkg string, race bool) (broker, worker string) {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the broker and worker programs: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	build := func(out, pkg string, extra ...string) {
		args := append([]string{"build", "-o", out}, extra...)
		cmd := exec.CommandContext(ctx, goBin, append(args, pkg)...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	broker, worker = filepath.Join(dir, "broker"), filepath.Join(dir, "worker")
	start := time.Now()
	build(broker, BrokerPackage)
	if race {
		build(worker, workerPkg, "-race")
	} else {
		build(worker, workerPkg)
	}
	t.Logf("built broker and worker (race %v) in %s", race, time.Since(start).Round(time.Millisecond))
	return broker, worker
}

// proc is a child process: its own process group, killed with the test,
// stderr (and stdout after the ready line) in a log file.
type proc struct {
	name    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser // held open: the child exits when it closes
	logPath string

	exited  chan struct{}
	waitErr error // set before exited is closed

	mu       sync.Mutex
	expected bool // the driver killed it on purpose
}

// errNotReady is wrapped by startProc's error when the program did not
// print its ready line.
var errNotReady = errors.New("not ready")

// startProc starts bin and waits up to readyTimeout for its ready line on
// stdout, returning what followed "ready" on that line. The process is
// killed (its whole group, with SIGKILL) when the test ends.
func startProc(t *testing.T, name, logDir string, readyTimeout time.Duration, bin string, args ...string) (*proc, string, error) {
	t.Helper()
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = logFile
	stdout, stdoutW, err := os.Pipe()
	if err != nil {
		logFile.Close()
		return nil, "", err
	}
	cmd.Stdout = stdoutW
	stdin, err := cmd.StdinPipe()
	if err != nil {
		logFile.Close()
		stdout.Close()
		stdoutW.Close()
		return nil, "", err
	}
	err = cmd.Start()
	stdoutW.Close() // the child holds its own copy
	if err != nil {
		logFile.Close()
		stdout.Close()
		return nil, "", fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, stdin: stdin, logPath: logPath, exited: make(chan struct{})}
	ready := make(chan string, 1)
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		defer stdout.Close()
		sc := bufio.NewScanner(stdout)
		first := true
		for sc.Scan() {
			line := sc.Text()
			if first && strings.HasPrefix(line, chaos.ReadyLine) {
				first = false
				ready <- strings.TrimSpace(strings.TrimPrefix(line, chaos.ReadyLine))
				continue
			}
			fmt.Fprintln(logFile, "stdout:", line)
		}
	}()
	go func() {
		p.waitErr = cmd.Wait()
		<-scanned // the child is gone, so its stdout ends
		logFile.Close()
		close(p.exited)
	}()
	t.Cleanup(func() { p.kill() })

	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case rest := <-ready:
		return p, rest, nil
	case <-p.exited:
		return nil, "", fmt.Errorf("%s exited before it was ready (%v): %w; its log:\n%s", name, p.waitErr, errNotReady, p.logTail(30))
	case <-timer.C:
		p.kill()
		return nil, "", fmt.Errorf("%s printed no ready line within %s: %w; its log:\n%s", name, readyTimeout, errNotReady, p.logTail(30))
	}
}

// kill sends SIGKILL to the process group and waits for the process to be
// reaped; the exit is expected.
func (p *proc) kill() {
	p.mu.Lock()
	p.expected = true
	p.mu.Unlock()
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
	}
	_ = p.stdin.Close()
}

// signal sends sig to the process group.
func (p *proc) signal(sig syscall.Signal) error {
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// alive reports whether the process is running (not exited).
func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// unexpectedExit returns a description of the process's exit if it exited
// without the driver killing it, or "".
func (p *proc) unexpectedExit() string {
	if p.alive() {
		return ""
	}
	p.mu.Lock()
	expected := p.expected
	p.mu.Unlock()
	if expected {
		return ""
	}
	return fmt.Sprintf("%s exited on its own (%v); its log ends:\n%s", p.name, p.waitErr, p.logTail(30))
}

// logTail returns the last n lines of the process's log.
func (p *proc) logTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startBroker starts the broker program on a free port and returns it with
// its address. A port taken between the check and the bind is retried.
func startBroker(t *testing.T, bin, logDir string, minSession time.Duration) (*proc, string) {
	t.Helper()
	var lastErr error
	for attempt := range 3 {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		p, addr, err := startProc(t, fmt.Sprintf("broker-%d", attempt), logDir, time.Minute, bin,
			"-port", fmt.Sprint(port), "-min-session-timeout", minSession.String(), "-exit-with-stdin")
		if err == nil {
			return p, addr
		}
		lastErr = err
	}
	t.Fatalf("the broker did not start: %v", lastErr)
	return nil, ""
}
