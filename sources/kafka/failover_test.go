package kafka

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5/pgxpool"
)

// failoverConfig is the configuration of both workers of
// TestFailoverAfterKill: the library's default session, heartbeat,
// rebalance and revoke timeouts, with the quick fetches of the tests.
func failoverConfig(brokers []string, group, topic string) Config {
	return Config{
		Brokers: brokers, Group: group, Topics: []string{topic},
		MaxWait: kafkatest.MaxWait, JoinGroupBackoff: 200 * time.Millisecond,
		Logger: testLogger(),
	}
}

// TestWorkerProcess is the worker that TestFailoverAfterKill runs in a
// process of its own and kills; it does nothing when run otherwise.
func TestWorkerProcess(t *testing.T) {
	if os.Getenv("KAFKA_WORKER_PROCESS") == "" {
		t.Skip("the worker process of TestFailoverAfterKill")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("KAFKA_WORKER_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(pool, failoverConfig(strings.Split(os.Getenv("KAFKA_WORKER_BROKERS"), ","),
		os.Getenv("KAFKA_WORKER_GROUP"), os.Getenv("KAFKA_WORKER_TOPIC")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Migrate(ctx, pool, "", s.Migrations()...); err != nil {
		t.Fatal(err)
	}
	w := startWorkers(ctx, s, pool, 2, 50, nil)
	w.wait(t) // until killed
}

// TestFailoverAfterKill: a worker process is killed with SIGKILL, so it
// neither leaves the group nor closes anything itself (the kernel closes
// its sockets, which the coordinator ignores: only missed heartbeats end a
// session, as on a real broker). The surviving worker consumes the dead
// worker's partitions once the coordinator's session timeout expired and
// the group rebalanced: within SessionTimeout + RebalanceTimeout, and in
// practice about SessionTimeout + HeartbeatInterval.
func TestFailoverAfterKill(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a session timeout")
	}
	e := newEnv(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var out logBuffer // the child process and the test write and read it at once
	child := exec.Command(os.Args[0], "-test.run=^TestWorkerProcess$", "-test.count=1")
	child.Env = append(os.Environ(),
		"KAFKA_WORKER_PROCESS=1",
		"KAFKA_WORKER_DSN="+e.pool.Config().ConnString(),
		"KAFKA_WORKER_BROKERS="+strings.Join(e.kafka.Brokers(), ","),
		"KAFKA_WORKER_GROUP="+e.group,
		"KAFKA_WORKER_TOPIC="+e.topic,
	)
	child.Stdout, child.Stderr = &out, &out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = child.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = child.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("worker process output:\n%s", out.String())
		}
	})

	// The worker process consumes the topic alone, then a second worker
	// joins and takes half of the partitions.
	e.produce(0, 100)
	e.waitEffects(100, 2*time.Minute)
	cfg := failoverConfig(e.kafka.Brokers(), e.group, e.topic)
	survivor := e.source(func(c *Config) { *c = cfg })
	w := startWorkers(ctx, survivor, e.pool, 2, 50, nil)
	waitFor(t, 2*time.Minute, "the survivor's share of the partitions", func() bool { return len(survivor.Assignment()) == 2 })
	e.produce(100, 200)
	e.waitEffects(200, 2*time.Minute)

	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	<-exited
	e.produce(200, 300)
	e.waitEffects(300, 3*time.Minute)
	stall := time.Since(killed)

	d := cfg.withDefaults()
	if bound := d.SessionTimeout + d.RebalanceTimeout; stall > bound {
		t.Errorf("the dead worker's partitions were consumed %s after the kill, more than SessionTimeout + RebalanceTimeout = %s", stall, bound)
	}
	t.Logf("the dead worker's partitions stalled for %s (SessionTimeout %s, HeartbeatInterval %s)",
		stall.Round(10*time.Millisecond), d.SessionTimeout, d.HeartbeatInterval)
	if got := survivor.Assignment(); len(got) != 4 {
		t.Errorf("the survivor owns %v, want all four partitions", got)
	}
	cancel()
	w.wait(t)
	if rows, distinct := e.effects(); rows != 300 || distinct != 300 {
		t.Fatalf("%d effect rows for %d distinct messages, want 300 of each", rows, distinct)
	}
}
