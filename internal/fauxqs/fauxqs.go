package fauxqs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// EnvEndpoint names the environment variable that, when set, points the
// tests at an existing SQS endpoint instead of a fresh emulator.
const EnvEndpoint = "SQS_ENDPOINT"

// InstallHint is the command that installs the pinned emulator.
const InstallHint = "npm ci --prefix internal/fauxqs"

var shared struct {
	once   sync.Once
	server *Server
	err    error
}

// Server is a running emulator process.
type Server struct {
	// URL is the emulator's endpoint, such as http://127.0.0.1:40123.
	URL string

	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	log   *tailBuffer
}

// Endpoint returns the SQS endpoint the test should use: SQS_ENDPOINT if it
// is set, else the shared emulator of this test binary, started on first use.
func Endpoint(tb testing.TB) string {
	tb.Helper()
	if u := os.Getenv(EnvEndpoint); u != "" {
		return u
	}
	shared.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		shared.server, shared.err = Start(ctx)
	})
	if shared.err != nil {
		tb.Fatalf("%v", shared.err)
	}
	return shared.server.URL
}

// Main runs the tests, stops the shared emulator if one was started, and
// exits with the tests' exit code. Call it from TestMain:
//
//	func TestMain(m *testing.M) { fauxqs.Main(m) }
//
// A package whose TestMain already hands m to another helper (such as
// pgtest.Main) need not call it: the emulator also stops when the test
// binary exits.
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// Stop stops the shared emulator, if one was started, and forbids starting
// another.
func Stop() {
	shared.once.Do(func() { shared.err = errors.New("fauxqs: the shared emulator was already stopped") })
	if shared.server != nil {
		if err := shared.server.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
}

// Dir returns the directory that holds package.json and start.mjs.
func Dir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("fauxqs: cannot locate the harness directory")
	}
	return filepath.Dir(file), nil
}

// Start starts a new emulator on a free loopback port and waits until it
// answers HTTP requests.
func Start(ctx context.Context) (*Server, error) {
	dir, err := Dir()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "fauxqs", "package.json")); err != nil {
		return nil, fmt.Errorf("fauxqs: the SQS emulator is not installed (%s/node_modules/fauxqs is missing): run `%s` from the repository root, or set %s to an SQS endpoint", dir, InstallHint, EnvEndpoint)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("fauxqs: node (Node.js 20 or later) is not in PATH: %w; install it, or set %s to an SQS endpoint", err, EnvEndpoint)
	}

	cmd := exec.Command(node, "start.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "FAUXQS_PORT=0")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("fauxqs: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("fauxqs: %w", err)
	}
	logs := &tailBuffer{max: 8 << 10}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("fauxqs: start node: %w", err)
	}
	s := &Server{cmd: cmd, stdin: stdin, done: make(chan struct{}), log: logs}
	go func() { _ = cmd.Wait(); close(s.done) }()

	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if a, ok := strings.CutPrefix(line, "fauxqs listening on "); ok {
				select {
				case addr <- strings.TrimSpace(a):
				default:
				}
				continue
			}
			logs.Write([]byte(line + "\n"))
		}
	}()

	select {
	case a := <-addr:
		s.URL = a
	case <-s.done:
		return nil, fmt.Errorf("fauxqs: the emulator exited before it listened (%v); its output:\n%s\n(is it installed? run `%s`)", cmd.ProcessState, logs.String(), InstallHint)
	case <-ctx.Done():
		s.Stop()
		return nil, fmt.Errorf("fauxqs: the emulator did not start: %w; its output:\n%s", ctx.Err(), logs.String())
	}
	if err := waitReady(ctx, s.URL); err != nil {
		s.Stop()
		return nil, fmt.Errorf("fauxqs: the emulator at %s does not answer: %w; its output:\n%s", s.URL, err, logs.String())
	}
	return s, nil
}

// waitReady dials the endpoint until it accepts a TCP connection.
func waitReady(ctx context.Context, endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil {
		return err
	}
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", u.Host)
		if err == nil {
			return c.Close()
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop stops the emulator and waits for it to exit.
func (s *Server) Stop() error {
	_ = s.stdin.Close() // start.mjs stops when its stdin closes
	select {
	case <-s.done:
		return nil
	case <-time.After(5 * time.Second):
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	return nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
