package peers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// workerEnv carries a worker's Spec, as JSON, to the child process.
const workerEnv = "PEERS_WORKER_SPEC"

// Spec tells a worker process what to consume and when to stop.
type Spec struct {
	System  string
	Brokers []string
	Topic   string
	Group   string
	DB      string
	// Expect: once this many distinct records are settled, the worker
	// stops and prints its report. 0: it runs until SIGTERM.
	Expect int
	// CrashAt: right after the database commit that brings the records
	// committed to CrashAt, and before they are acknowledged to Kafka, the
	// worker kills itself with SIGKILL. 0: never.
	CrashAt int
	// SessionTimeout is the consumer group session timeout.
	SessionTimeout time.Duration
}

// workerReport is what a worker prints on stdout when it reached Spec.Expect:
// the time from the first record in hand to the last record settled.
type workerReport struct {
	Settled int
	Elapsed time.Duration
}

// MaybeWorker runs a worker and exits when the process was started as one
// (by Run); otherwise it returns at once. Call it first in main, or in
// TestMain.
func MaybeWorker() {
	raw := os.Getenv(workerEnv)
	if raw == "" {
		return
	}
	var spec Spec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "peers worker: bad spec:", err)
		os.Exit(2)
	}
	if err := runWorker(spec); err != nil {
		fmt.Fprintf(os.Stderr, "peers worker %s: %v\n", spec.System, err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runWorker(spec Spec) error {
	sys, ok := lookup(spec.System)
	if !ok {
		return fmt.Errorf("unknown system %q", spec.System)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	p := &progress{expect: spec.Expect, crashAt: spec.CrashAt, seen: map[uint64]struct{}{}, done: stop}
	if err := sys.run(ctx, spec, p); err != nil {
		return err
	}
	if spec.Expect == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end.IsZero() {
		return fmt.Errorf("stopped after %d of %d records", len(p.seen), spec.Expect)
	}
	return json.NewEncoder(os.Stdout).Encode(workerReport{Settled: len(p.seen), Elapsed: p.end.Sub(p.start)})
}

// progress is what a worker's consumer reports as it goes.
type progress struct {
	mu        sync.Mutex
	expect    int
	crashAt   int
	committed int
	seen      map[uint64]struct{} // settled records: partition<<40 | offset
	start     time.Time
	end       time.Time
	done      func() // stops the worker
}

// inHand notes that the consumer holds records to process.
func (p *progress) inHand() {
	p.mu.Lock()
	if p.start.IsZero() {
		p.start = time.Now()
	}
	p.mu.Unlock()
}

// commit notes that n more records' transaction committed, before they
// are acknowledged; the worker dies here when it reaches CrashAt.
func (p *progress) commit(n int) {
	p.mu.Lock()
	p.committed += n
	crash := p.crashAt > 0 && p.committed >= p.crashAt
	p.mu.Unlock()
	if crash {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}

// settled notes that a record was settled: committed and acknowledged, or
// dropped as a duplicate.
func (p *progress) settled(partition int32, offset int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen[uint64(partition)<<40|uint64(offset)] = struct{}{}
	if p.expect > 0 && len(p.seen) >= p.expect && p.end.IsZero() {
		p.end = time.Now()
		p.done()
	}
}

// proc is a worker process seen from the parent.
type proc struct {
	cmd      *exec.Cmd
	stdout   tail
	stderr   tail
	exited   chan struct{}
	err      error
	timedOut bool // wait killed it
}

// startWorker starts the running binary again as a worker for spec.
func startWorker(spec Spec) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	p := &proc{exited: make(chan struct{})}
	p.cmd = exec.Command(exe)
	p.cmd.Env = append(os.Environ(), workerEnv+"="+string(raw))
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	return p, nil
}

// wait waits for the worker to exit, for at most timeout (then it is
// killed), and returns its exit error.
func (p *proc) wait(timeout time.Duration) error {
	select {
	case <-p.exited:
		return p.err
	case <-time.After(timeout):
		p.timedOut = true
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("worker did not finish within %s; its stderr:\n%s", timeout, p.stderr.String())
	}
}

// stop asks the worker to stop (SIGTERM) and waits for it, killing it
// after timeout.
func (p *proc) stop(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	return p.wait(timeout)
}

// killed tells whether the worker died of SIGKILL, and not because wait
// ran out of time.
func (p *proc) killed() bool {
	<-p.exited
	if p.timedOut {
		return false
	}
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// report parses the worker's report.
func (p *proc) report() (workerReport, error) {
	var r workerReport
	if err := json.Unmarshal(p.stdout.Bytes(), &r); err != nil {
		return r, fmt.Errorf("no report from the worker (%v); its stderr:\n%s", err, p.stderr.String())
	}
	return r, nil
}

// failure describes a worker that exited with err.
func (p *proc) failure(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return fmt.Errorf("worker: %v; its stderr:\n%s", err, p.stderr.String())
	}
	return err
}

// tail keeps the last 64 KiB written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - 64<<10; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(b), nil
}

func (t *tail) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.buf...)
}

func (t *tail) String() string { return string(t.Bytes()) }

// waitUntil polls cond every 50ms until it is true, ctx is done or the
// worker p exited.
func waitUntil(ctx context.Context, p *proc, cond func(context.Context) (bool, error)) error {
	for {
		ok, err := cond(ctx)
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; the worker's stderr:\n%s", ctx.Err(), p.stderr.String())
		case <-p.exited:
			return fmt.Errorf("worker exited early (%v); its stderr:\n%s", p.err, p.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
