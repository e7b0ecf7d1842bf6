package sqs_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/childtest"
	"github.com/effectively-once/effectively/internal/commitgate"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/sources/sqs"
	"github.com/jackc/pgx/v5/pgxpool"
)

// frozenTimeouts are the visibility and idle-in-transaction timeouts of
// both workers of a TestFrozenInCommit case.
type frozenTimeouts struct{ visibility, idleTx time.Duration }

const (
	frozenWait = time.Second
	frozenApp  = "frozen-sqs-worker"
)

func (ft frozenTimeouts) source() sqs.Config {
	return sqs.Config{
		Receivers: 1, WaitTime: frozenWait,
		VisibilityTimeout: ft.visibility, HeartbeatInterval: ft.visibility / 3,
	}
}

func (ft frozenTimeouts) consumer(tb testing.TB, concurrency int, hooks ...consumer.Hook) consumer.Config {
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	return consumer.Config{
		Name: "frozen", Strategy: strategy, BatchHandler: insertEffects, KeyFunc: sqs.ParkUnreadable(nil),
		BatchSize: 10, Concurrency: concurrency, IdleTxTimeout: ft.idleTx,
		RetryBackoff: 50 * time.Millisecond, MaxRetryBackoff: time.Second,
		Hooks: hooks, Logger: consumertest.Logger(),
	}
}

// slowBatches prints a line for every batch that took a second or more,
// or that failed or lost its COMMIT: the frozen batch is among them.
type slowBatches struct{}

func (slowBatches) BatchDone(_ context.Context, s *consumer.BatchStats) {
	if s.Total < time.Second && !s.CommitLost && s.Err == nil {
		return
	}
	fmt.Printf("BATCH lane=%s size=%d applied=%d duplicate=%d unknown=%d lost=%t total=%dms err=%v\n",
		s.Lane, s.Size, s.Applied, s.Duplicate, s.Unknown, s.CommitLost, s.Total.Milliseconds(), s.Err)
}

var _ consumer.Hook = slowBatches{}

// TestFrozenInCommitChild is the worker process TestFrozenInCommit
// freezes; it does nothing when run otherwise. Its connections to
// PostgreSQL go through the test's commit gate.
func TestFrozenInCommitChild(t *testing.T) {
	if os.Getenv("SQS_FROZEN_CHILD") == "" {
		t.Skip("the worker process of TestFrozenInCommit")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cfg, err := pgxpool.ParseConfig(os.Getenv("SQS_FROZEN_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	gate := os.Getenv("SQS_FROZEN_GATE")
	cfg.ConnConfig.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", gate)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = frozenApp
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	v, err := time.ParseDuration(os.Getenv("SQS_FROZEN_VISIBILITY"))
	if err != nil {
		t.Fatal(err)
	}
	idle, err := time.ParseDuration(os.Getenv("SQS_FROZEN_IDLE_TX"))
	if err != nil {
		t.Fatal(err)
	}
	ft := frozenTimeouts{visibility: v, idleTx: idle}
	scfg := ft.source()
	scfg.Client = fauxqs.NewClient(os.Getenv("SQS_FROZEN_ENDPOINT"))
	scfg.QueueURL = os.Getenv("SQS_FROZEN_QUEUE")
	src, err := sqs.New(ctx, scfg)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	// One batch at a time: the frozen batch is the worker's only transaction.
	c := consumertest.NewConsumer(t, pool, src, ft.consumer(t, 1, slowBatches{}))
	fmt.Println("READY")
	if err := c.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFrozenInCommit: a worker process is frozen (SIGSTOP) while the
// COMMIT of one of its batches is on the wire, until the visibility
// timeout of its messages ran out. Held: the COMMIT has not reached the
// server, whose transaction goes on holding the batch's markers until
// IdleTxTimeout; with the defaults' order (IdleTxTimeout shorter than the
// visibility timeout) they are released before the messages reappear, and
// with the other order the survivor's claim meets them locked and waits.
// Executed: the server committed, and the reply waits unread. The survivor
// handles every message within max(VisibilityTimeout, IdleTxTimeout) plus
// a receive. When the frozen worker is continued it reports what really
// became of its batch and goes on consuming, and every message has
// exactly one effect.
func TestFrozenInCommit(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("waits for a visibility timeout and an idle-in-transaction timeout")
	}
	t.Run("held", func(t *testing.T) {
		t.Parallel()
		frozenInCommit(t, commitgate.Hold, frozenTimeouts{visibility: 6 * time.Second, idleTx: 3 * time.Second})
	})
	t.Run("held past the visibility timeout", func(t *testing.T) {
		t.Parallel()
		frozenInCommit(t, commitgate.Hold, frozenTimeouts{visibility: 3 * time.Second, idleTx: 8 * time.Second})
	})
	t.Run("executed", func(t *testing.T) {
		t.Parallel()
		frozenInCommit(t, commitgate.Forward, frozenTimeouts{visibility: 3 * time.Second, idleTx: 8 * time.Second})
	})
}

func frozenInCommit(t *testing.T, mode commitgate.Mode, ft frozenTimeouts) {
	c := client(t)
	e := newE2E(t, fauxqs.NewQueue(t, c, "frozen", nil))
	gate := commitgate.New(t, &e.pool.Config().ConnConfig.Config)
	child := childtest.Start(t, "TestFrozenInCommitChild",
		"SQS_FROZEN_CHILD=1",
		"SQS_FROZEN_DSN="+e.pool.Config().ConnString(),
		"SQS_FROZEN_GATE="+gate.Addr(),
		"SQS_FROZEN_ENDPOINT="+fauxqs.Endpoint(t),
		"SQS_FROZEN_QUEUE="+e.queue,
		"SQS_FROZEN_VISIBILITY="+ft.visibility.String(),
		"SQS_FROZEN_IDLE_TX="+ft.idleTx.String(),
	)
	child.Expect("READY")
	warm, frozen, others, later := keyed("w", 10), keyed("f", 10), keyed("o", 30), keyed("l", 10)
	send(t, c, e.queue, warm)
	e.waitFor("the worker's first messages", 2*time.Minute, e.drained(len(warm)))

	var frozenAt time.Time
	freezeErr := make(chan error, 1)
	gate.Arm(mode, func() {
		freezeErr <- child.Freeze()
		frozenAt = time.Now()
	})
	send(t, c, e.queue, frozen)
	select {
	case <-gate.Caught():
	case <-time.After(2 * time.Minute):
		t.Fatal("the worker sent no batch COMMIT")
	}
	if err := <-freezeErr; err != nil {
		t.Fatal(err)
	}
	thawed := false
	defer func() {
		if !thawed {
			_ = child.Cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	if mode == commitgate.Forward {
		e.waitFor("the frozen worker's COMMIT executed", time.Minute, func() bool {
			return e.childSessions("idle in transaction", "active") == 0
		})
	}

	send(t, c, e.queue, others)
	survivor := consumertest.Start(e.consumer(e.source(ft.source()), ft.consumer(t, 2)))
	defer survivor.Stop(t)
	e.waitFor("every message", 2*time.Minute, e.drained(len(warm)+len(frozen)+len(others)))
	// The frozen batch's messages reappear after the visibility timeout;
	// a receive later the survivor has them, and its claim waits for the
	// frozen transaction's markers until the server ended it. (The slack
	// is for a loaded machine; a transaction the server did not end would
	// hold them for as long as the freeze lasts.)
	bound := max(ft.visibility, ft.idleTx) + frozenWait + 5*time.Second
	if mode == commitgate.Forward {
		bound = ft.visibility + frozenWait + 5*time.Second
	}
	if stall := time.Since(frozenAt); stall > bound {
		t.Errorf("every message handled %s after the freeze, more than the bound %s", stall, bound)
	} else {
		t.Logf("every message handled %s after the freeze (bound %s)", stall.Round(10*time.Millisecond), bound)
	}

	// The frozen worker wakes up and reports what became of its batch.
	child.Thaw()
	thawed = true
	gate.Release()
	line := frozenBatch(t, child, time.Since(frozenAt)/2)
	t.Logf("the frozen batch: %s", line)
	if mode == commitgate.Hold {
		if !strings.Contains(line, " applied=0 ") || strings.Contains(line, "err=<nil>") {
			t.Errorf("the frozen batch, whose COMMIT never reached the server: %s; want nothing applied and an error", line)
		}
	} else if strings.Contains(line, " applied=0 ") || !strings.Contains(line, "err=<nil>") {
		t.Errorf("the frozen batch, whose COMMIT the server executed: %s; want its messages applied", line)
	}

	// It goes on consuming.
	send(t, c, e.queue, later)
	all := append(append(append(append([]outgoing{}, warm...), frozen...), others...), later...)
	e.waitFor("the messages sent after the thaw", 2*time.Minute, e.drained(len(all)))
	if err := child.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := child.Cmd.Wait(); err != nil {
		t.Errorf("the worker process: %v", err)
	}
	e.expectOnce(bodiesOf(all))
}

var batchTotal = regexp.MustCompile(` total=(\d+)ms `)

// frozenBatch returns the child's line about the batch that took at least
// least.
func frozenBatch(t *testing.T, child *childtest.Child, least time.Duration) string {
	t.Helper()
	for {
		l := child.Expect("BATCH ")
		if m := batchTotal.FindStringSubmatch(l); m != nil {
			if ms, _ := strconv.Atoi(m[1]); time.Duration(ms)*time.Millisecond >= least {
				return l
			}
		}
	}
}

// childSessions counts the frozen worker's sessions in one of states.
func (e *e2e) childSessions(states ...string) int {
	e.t.Helper()
	var n int
	err := e.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1 AND state = ANY($2)`, frozenApp, states).Scan(&n)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}
