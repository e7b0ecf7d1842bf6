package kafka

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
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// frozenIdleTx is the consumers' IdleTxTimeout in TestFrozenInCommit:
// longer than the session timeout plus a rebalance, so that the survivor
// has consumed the partitions the frozen worker does not hold locked
// before the server ends the frozen transaction.
const frozenIdleTx = 15 * time.Second

const frozenApp = "frozen-worker"

// frozenConfig is the Kafka configuration of both workers.
func frozenConfig(brokers []string, group, topic string) Config {
	return Config{
		Brokers: brokers, Group: group, Topics: []string{topic},
		MaxWait:           kafkatest.MaxWait,
		SessionTimeout:    kafkatest.SessionTimeout,
		HeartbeatInterval: kafkatest.HeartbeatInterval,
		RebalanceTimeout:  5 * time.Second,
		RevokeTimeout:     2 * time.Second,
		JoinGroupBackoff:  200 * time.Millisecond,
		Logger:            testLogger(),
	}
}

// frozenEngine is the consumer of both workers.
func frozenEngine(tb testing.TB, pool *pgxpool.Pool, src consumer.Source, concurrency int, hooks ...consumer.Hook) *consumer.Consumer {
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	return consumertest.NewConsumer(tb, pool, src, consumer.Config{
		Name:            "ledger",
		Strategy:        strategy,
		BatchHandler:    insertEffects,
		BatchSize:       10,
		Concurrency:     concurrency,
		IdleTxTimeout:   frozenIdleTx,
		RetryBackoff:    50 * time.Millisecond,
		MaxRetryBackoff: time.Second,
		Hooks:           hooks,
		Logger:          testLogger(),
	})
}

// slowBatches prints a line for every batch whose COMMIT took a second or
// more, or that failed, lost its COMMIT or was fenced: the frozen batch is
// among them.
type slowBatches struct{}

func (slowBatches) BatchDone(_ context.Context, s *consumer.BatchStats) {
	if s.Total < time.Second && !s.CommitLost && !s.Fenced && s.Err == nil {
		return
	}
	fmt.Printf("BATCH lane=%s size=%d applied=%d duplicate=%d unknown=%d lost=%t fenced=%t total=%dms err=%v\n",
		s.Lane, s.Size, s.Applied, s.Duplicate, s.Unknown, s.CommitLost, s.Fenced, s.Total.Milliseconds(), s.Err)
}

var _ consumer.Hook = slowBatches{}

// TestFrozenInCommitChild is the worker process TestFrozenInCommit
// freezes; it does nothing when run otherwise. Its connections to
// PostgreSQL go through the test's commit gate.
func TestFrozenInCommitChild(t *testing.T) {
	if os.Getenv("KAFKA_FROZEN_CHILD") == "" {
		t.Skip("the worker process of TestFrozenInCommit")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cfg, err := pgxpool.ParseConfig(os.Getenv("KAFKA_FROZEN_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	gate := os.Getenv("KAFKA_FROZEN_GATE")
	cfg.ConnConfig.DialFunc = func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", gate)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = frozenApp
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	src, err := New(pool, frozenConfig(strings.Split(os.Getenv("KAFKA_FROZEN_BROKERS"), ","),
		os.Getenv("KAFKA_FROZEN_GROUP"), os.Getenv("KAFKA_FROZEN_TOPIC")))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	// One batch at a time: the frozen batch is the worker's only transaction.
	c := frozenEngine(t, pool, src, 1, slowBatches{})
	fmt.Println("READY")
	if err := c.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFrozenInCommit: a worker process is frozen (SIGSTOP) while the
// COMMIT of one of its batches is on the wire, and the coordinator drops
// it from the group. Held: the COMMIT has not reached the server, whose
// transaction goes on holding the partition's offsets row and the batch's
// markers. Executed: the server committed, and the reply waits unread.
// The survivor consumes every partition the frozen worker does not hold
// locked as soon as the group rebalanced, and the locked one within
// max(SessionTimeout, IdleTxTimeout) plus a rebalance, as package
// documentation says. When the frozen worker is continued it reports
// what really became of its batch, rejoins the group, and every message
// has exactly one effect.
func TestFrozenInCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a session timeout and an idle-in-transaction timeout")
	}
	t.Run("held", func(t *testing.T) { t.Parallel(); frozenInCommit(t, commitgate.Hold) })
	t.Run("executed", func(t *testing.T) { t.Parallel(); frozenInCommit(t, commitgate.Forward) })
}

func frozenInCommit(t *testing.T, mode commitgate.Mode) {
	e := newEnv(t, 4)
	gate := commitgate.New(t, &e.pool.Config().ConnConfig.Config)
	child := childtest.Start(t, "TestFrozenInCommitChild",
		"KAFKA_FROZEN_CHILD=1",
		"KAFKA_FROZEN_DSN="+e.pool.Config().ConnString(),
		"KAFKA_FROZEN_GATE="+gate.Addr(),
		"KAFKA_FROZEN_BROKERS="+strings.Join(e.kafka.Brokers(), ","),
		"KAFKA_FROZEN_GROUP="+e.group,
		"KAFKA_FROZEN_TOPIC="+e.topic,
	)
	child.Expect("READY")
	e.produce(0, 40)
	e.waitEffects(40, 2*time.Minute)

	var frozenAt time.Time
	freezeErr := make(chan error, 1)
	gate.Arm(mode, func() {
		freezeErr <- child.Freeze()
		frozenAt = time.Now()
	})
	e.produce(40, 80) // 20 messages a partition
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

	cfg := frozenConfig(e.kafka.Brokers(), e.group, e.topic)
	bound := cfg.SessionTimeout + cfg.RebalanceTimeout
	var frozenLane string
	if mode == commitgate.Hold {
		locked := e.lockedPartitions()
		if len(locked) != 1 {
			t.Fatalf("offsets rows locked by the frozen worker: %v, want one", locked)
		}
		frozenLane = laneName(e.topic, locked[0])
		bound = max(cfg.SessionTimeout, frozenIdleTx) + claimRetryMax + cfg.RebalanceTimeout
	} else {
		waitFor(t, time.Minute, "the frozen worker's COMMIT executed", func() bool {
			return e.childSessions("idle in transaction", "active") == 0
		})
	}

	survivor := consumertest.Start(frozenEngine(t, e.pool, e.source(func(c *Config) { *c = cfg }), 4))
	defer survivor.Stop(t)
	if mode == commitgate.Hold {
		waitFor(t, 2*time.Minute, "the partitions the frozen worker does not hold locked", func() bool {
			return e.effectsOn(frozenLane, false) == 60
		})
		if n := e.childSessions("idle in transaction"); n != 1 {
			t.Fatalf("%d sessions of the frozen worker idle in transaction, want 1: the others waited for the frozen transaction to end", n)
		}
		t.Logf("the partitions the frozen worker did not lock consumed %s after the freeze", time.Since(frozenAt).Round(10*time.Millisecond))
	}
	e.waitEffects(80, 2*time.Minute)
	if stall := time.Since(frozenAt); stall > bound {
		t.Errorf("every partition consumed %s after the freeze, more than the bound %s", stall, bound)
	} else {
		t.Logf("every partition consumed %s after the freeze (bound %s)", stall.Round(10*time.Millisecond), bound)
	}

	// The frozen worker wakes up and reports what became of its batch.
	child.Thaw()
	thawed = true
	gate.Release()
	frozen := frozenBatch(t, child, time.Since(frozenAt)/2)
	t.Logf("the frozen batch: %s", frozen)
	if mode == commitgate.Hold {
		if !strings.Contains(frozen, " applied=0 ") || strings.Contains(frozen, "err=<nil>") {
			t.Errorf("the frozen batch, whose COMMIT never reached the server: %s; want nothing applied and an error", frozen)
		}
	} else if strings.Contains(frozen, " applied=0 ") || !strings.Contains(frozen, "err=<nil>") {
		t.Errorf("the frozen batch, whose COMMIT the server executed: %s; want its messages applied", frozen)
	}

	// It rejoins the group and consumes its share again.
	e.produce(80, 120)
	e.waitEffects(120, 2*time.Minute)
	if err := child.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := child.Cmd.Wait(); err != nil {
		t.Errorf("the worker process: %v", err)
	}
	if rows, distinct := e.effects(); rows != 120 || distinct != 120 {
		t.Fatalf("%d effect rows for %d distinct messages, want 120 of each", rows, distinct)
	}
	for p, row := range e.storedOffsets() {
		if row[0] != 30 {
			t.Errorf("partition %d: stored next offset %d, want 30", p, row[0])
		}
	}
}

var batchCommit = regexp.MustCompile(` total=(\d+)ms `)

// frozenBatch returns the child's line about the batch whose COMMIT took
// at least least.
func frozenBatch(t *testing.T, child *childtest.Child, least time.Duration) string {
	t.Helper()
	for {
		l := child.Expect("BATCH ")
		if m := batchCommit.FindStringSubmatch(l); m != nil {
			if ms, _ := strconv.Atoi(m[1]); time.Duration(ms)*time.Millisecond >= least {
				return l
			}
		}
	}
}

// lockedPartitions returns the partitions whose offsets row of the group
// a transaction holds locked.
func (e *env) lockedPartitions() []int {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `
WITH free AS (SELECT partition FROM effectively.kafka_offsets WHERE group_id = $1 AND topic = $2 FOR UPDATE SKIP LOCKED)
SELECT partition FROM effectively.kafka_offsets WHERE group_id = $1 AND topic = $2 AND partition NOT IN (SELECT partition FROM free)`, e.group, e.topic)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []int
	for rows.Next() {
		var p int
		if err := rows.Scan(&p); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, p)
	}
	if rows.Err() != nil {
		e.t.Fatal(rows.Err())
	}
	return out
}

// childSessions counts the frozen worker's sessions in one of states.
func (e *env) childSessions(states ...string) int {
	e.t.Helper()
	var n int
	err := e.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1 AND state = ANY($2)`, frozenApp, states).Scan(&n)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}
