package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// failingSource is a Source whose Fetch fails with err every time (or, with
// a nil err, returns no batch and no error, breaking the contract).
type failingSource struct {
	err   error
	calls atomic.Int32
}

func (s *failingSource) Fetch(ctx context.Context, _ int) (*consumer.Batch, error) {
	s.calls.Add(1)
	return nil, s.err
}

func (s *failingSource) Settle(context.Context, *consumer.Batch, []*consumer.Message, []consumer.Retry) error {
	return nil
}

// runWithin runs c and returns Run's error, failing the test if Run has not
// returned within guard (a guard against a hung test, not a timing check).
func runWithin(t *testing.T, c *consumer.Consumer, ctx context.Context, guard time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(guard):
		t.Fatalf("Run did not return within %s", guard)
		return nil
	}
}

// A source that keeps failing stops Run with its error once
// SourceFailureTimeout has passed; a Permanent error stops it at once; a
// Fetch that returns neither a batch nor an error is a failure too, backed
// off like one, not a reason to spin.
func TestRunStopsOnASourceThatKeepsFailing(t *testing.T) {
	t.Parallel()
	refused := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	for name, tc := range map[string]struct {
		err     error
		want    string
		timeout time.Duration
	}{
		"error":     {err: refused, want: "connection refused", timeout: 300 * time.Millisecond},
		"permanent": {err: consumer.Permanent(errors.New("queue does not exist")), want: "queue does not exist"},
		"empty":     {err: nil, want: "no batch and no error", timeout: 300 * time.Millisecond},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, consumertest.Config{})
			src := &failingSource{err: tc.err}
			c := consumertest.NewConsumer(t, e.pool, src, e.config(consumer.Config{
				Concurrency: 2, RetryBackoff: 200 * time.Millisecond, SourceFailureTimeout: tc.timeout,
			}))
			err := runWithin(t, c, context.Background(), 30*time.Second)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, want an error saying %q", err, tc.want)
			}
			if tc.err != nil && !errors.Is(err, tc.err) {
				t.Errorf("Run = %v, want it to wrap the source's error", err)
			}
			// Two workers backing off from 25ms (RetryBackoff/4) for 300ms
			// make a handful of calls; a spinning loop makes millions.
			if n := src.calls.Load(); n > 40 {
				t.Errorf("Fetch called %d times: the loop does not back off", n)
			}
		})
	}
}

// With no Logger configured, the consumer's warnings and errors reach
// stderr: a wrong broker address does not fail in silence.
func TestDefaultLoggerWritesFailuresToStderr(t *testing.T) {
	if url := os.Getenv("EFFECTIVELY_STDERR_CHILD_DB"); url != "" {
		stderrChild(url)
		return
	}
	t.Parallel()
	e := newEnv(t, consumertest.Config{})
	cmd := exec.Command(os.Args[0], "-test.run=^TestDefaultLoggerWritesFailuresToStderr$", "-test.count=1")
	cmd.Env = append(os.Environ(), "EFFECTIVELY_STDERR_CHILD_DB="+e.pool.Config().ConnString())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("child: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{"level=ERROR", "fetch failed", "connection refused"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}

// stderrChild runs a consumer with the default logger against a source that
// cannot connect, until Run gives up.
func stderrChild(url string) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	s, err := idset.New(idset.Config{})
	if err != nil {
		panic(err)
	}
	src := &failingSource{err: errors.New("dial tcp 127.0.0.1:1: connect: connection refused")}
	c, err := consumer.New(pool, src, consumer.Config{Name: "stderr", Strategy: s, Handler: insertEffect,
		RetryBackoff: 40 * time.Millisecond, SourceFailureTimeout: 50 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	if err := c.Migrate(ctx); err != nil {
		panic(err)
	}
	if err := c.Run(ctx); err == nil {
		panic("Run returned nil for a source that never connected")
	}
}

// finiteSource is a Broker that says it is done once it has nothing left:
// every message acknowledged, nothing waiting for redelivery. It is meant
// for one worker, so that nothing is in flight when Fetch looks.
type finiteSource struct{ *consumertest.Broker }

func (s finiteSource) Fetch(ctx context.Context, max int) (*consumer.Batch, error) {
	if s.Idle() {
		return nil, fmt.Errorf("replay finished: %w", consumer.ErrSourceDone)
	}
	return s.Broker.Fetch(ctx, max)
}

// A finite source that reports ErrSourceDone ends Run cleanly: nil, once
// everything settled, without the caller cancelling anything.
func TestRunReturnsWhenTheSourceIsDone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 3})
	const n = 300
	for i, id := range ids("m", n) {
		e.broker.Publish(i, msg(id, id))
	}
	var failed sync.Map
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if _, again := failed.LoadOrStore(m.ID, true); !again && strings.HasSuffix(m.ID, "7") {
			return errors.New("transient") // a retry in flight when the rest is done
		}
		return insertEffect(ctx, tx, m)
	}
	c := consumertest.NewConsumer(t, e.pool, finiteSource{e.broker}, e.config(consumer.Config{Handler: h, Concurrency: 1, BatchSize: 50}))
	if err := runWithin(t, c, context.Background(), time.Minute); err != nil {
		t.Fatalf("Run = %v, want nil when the source is done", err)
	}
	counts := e.effectCounts()
	for _, id := range ids("m", n) {
		if counts[id] != 1 {
			t.Errorf("%s has %d effects, want 1", id, counts[id])
		}
	}
}

// A handler that ignores its context cannot hold shutdown past
// ShutdownTimeout: Run returns ErrShutdownTimeout, the batch is not
// acknowledged, and when the handler finally returns, nothing of its batch
// commits.
func TestShutdownTimeoutIsEnforced(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	e.broker.Publish(0, msg("stuck", "x"))
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := insertEffect(ctx, tx, m); err != nil {
			return err
		}
		once.Do(func() {
			close(entered)
			<-release // ignores ctx
		})
		return nil
	}
	batches := make(chan *consumer.BatchStats, 4)
	c := consumertest.NewConsumer(t, e.pool, e.broker, e.config(consumer.Config{Handler: h, Concurrency: 1,
		ShutdownTimeout: 200 * time.Millisecond,
		Hooks:           []consumer.Hook{hookFunc(func(_ context.Context, s *consumer.BatchStats) { batches <- s })}}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-entered
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, consumer.ErrShutdownTimeout) {
			t.Errorf("Run = %v, want ErrShutdownTimeout", err)
		}
	case <-time.After(20 * time.Second):
		close(release)
		t.Fatal("Run did not return with a handler ignoring its context")
	}
	close(release)
	select {
	case st := <-batches:
		if st.Err == nil || st.Applied != 0 {
			t.Errorf("the abandoned batch reported %d applied, err %v; want it rolled back", st.Applied, st.Err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the abandoned batch never finished")
	}
	if n := e.effectCounts()["stuck"]; n != 0 {
		t.Errorf("the abandoned batch committed %d effects", n)
	}
	if e.broker.Unacked() != 1 {
		t.Errorf("%d unacknowledged, want the abandoned message", e.broker.Unacked())
	}
}
