package cli_test

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/cli"
	"github.com/effectively-once/effectively/consumer"
)

// promptWriter collects a command's stderr and closes asked once the
// confirmation question is written.
type promptWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	asked chan struct{}
	once  sync.Once
}

func (w *promptWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if strings.Contains(w.buf.String(), "[y/N]") {
		w.once.Do(func() { close(w.asked) })
	}
	return n, err
}

// runAnswering runs a command that asks for confirmation, runs meanwhile
// while the question waits, then answers yes.
func (e *env) runAnswering(opts cli.Options, meanwhile func(), args ...string) (result, error) {
	e.t.Helper()
	opts.AssumeTerminal = true
	root := cli.NewRoot(opts)
	var out bytes.Buffer
	errw := &promptWriter{asked: make(chan struct{})}
	in, answer := io.Pipe()
	root.SetOut(&out)
	root.SetErr(errw)
	root.SetIn(in)
	root.SetArgs(append([]string{"--database-url", e.url}, args...))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	select {
	case <-errw.asked:
	case err := <-done:
		e.t.Fatalf("%s ended without asking: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	meanwhile()
	if _, err := answer.Write([]byte("y\n")); err != nil {
		e.t.Fatal(err)
	}
	err := <-done
	_ = answer.Close()
	errw.mu.Lock()
	defer errw.mu.Unlock()
	return result{out.String(), errw.buf.String()}, err
}

// purge and redrive act on the rows counted in their question: a message
// parked while the question waits is neither purged nor redriven.
func TestParkedPurgeRedriveActOnTheRowsConfirmed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must(stock, "migrate", "--yes")
	f := &fixable{}
	e.consume("ledger", f.handle, consumer.Message{ID: "bad-1", Value: []byte("bad one")})

	r, err := e.runAnswering(stock, func() {
		e.consume("ledger", f.handle, consumer.Message{ID: "bad-2", Value: []byte("bad two")})
	}, "parked", "purge", "--scope", "ledger", "--reason", "permanent")
	if err != nil {
		t.Fatalf("purge: %v\n%s", err, r.err)
	}
	if !strings.Contains(r.err, "Delete 1 parked message(s)") || !strings.Contains(r.out, "purged 1 parked") {
		t.Fatalf("purge:\n%s\n%s", r.err, r.out)
	}
	if n := e.count(`SELECT count(*) FROM effectively.parked WHERE dedupe_id = 'bad-2'`); n != 1 {
		t.Fatal("purge deleted the message parked while it asked")
	}

	ops := cli.Options{Handlers: map[string]consumer.Handler{"ledger": f.handle}}
	r, err = e.runAnswering(ops, func() {
		e.consume("ledger", f.handle, consumer.Message{ID: "bad-3", Value: []byte("bad three")})
		f.fix()
	}, "parked", "redrive", "--scope", "ledger", "--handler", "ledger")
	if err != nil {
		t.Fatalf("redrive: %v\n%s\n%s", err, r.err, r.out)
	}
	if !strings.Contains(r.err, "Redrive 1 parked message(s)") || !strings.Contains(r.out, "applied 1,") {
		t.Fatalf("redrive:\n%s\n%s", r.err, r.out)
	}
	if n := e.count(`SELECT count(*) FROM effects WHERE msg_id = 'bad-3'`); n != 0 {
		t.Fatal("redrive applied the message parked while it asked")
	}
	if n := e.count(`SELECT count(*) FROM effectively.parked WHERE dedupe_id = 'bad-3'`); n != 1 {
		t.Fatal("the message parked while redrive asked is no longer parked")
	}
	if n := e.count(`SELECT count(*) FROM effects WHERE msg_id = 'bad-2'`); n != 1 {
		t.Fatal("redrive did not apply the message it counted")
	}
}
