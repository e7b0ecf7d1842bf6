package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/cli"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/sources/kafka"
	kafkago "github.com/segmentio/kafka-go"
)

// kenv is a test's database, Kafka cluster, topic and group.
type kenv struct {
	*env
	k            *kafkatest.Cluster
	topic, group string
	partitions   int
}

func newKenv(t *testing.T, partitions int) *kenv {
	return newKenvOn(t, newEnv(t), partitions)
}

// newKenvOn is newKenv on the database of base.
func newKenvOn(t *testing.T, base *env, partitions int) *kenv {
	e := &kenv{env: base, k: kafkatest.New(t), topic: kafkatest.Name("transfers"), group: kafkatest.Name("ledger"), partitions: partitions}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.k.CreateTopic(ctx, e.topic, partitions); err != nil {
		t.Fatal(err)
	}
	e.must(stock, "migrate", "--kafka", "--yes")
	return e
}

// produce writes messages from..to-1: message i goes to partition
// i%partitions with idempotency key key(i), payload "v-" + key(i) ("bad-i"
// when bad(i)) and time at.
func (e *kenv) produce(from, to int, at time.Time, key func(int) string, bad func(int) bool) {
	e.t.Helper()
	var msgs []kafkago.Message
	for i := from; i < to; i++ {
		v := "v-" + key(i)
		if bad != nil && bad(i) {
			v = fmt.Sprintf("bad-%d", i)
		}
		msgs = append(msgs, kafkago.Message{
			Partition: i % e.partitions, Value: []byte(v), Time: at,
			Headers: []kafkago.Header{{Key: kafka.DefaultIDHeader, Value: []byte(key(i))}},
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.k.Produce(ctx, e.topic, msgs...); err != nil {
		e.t.Fatal(err)
	}
}

// totals counts outcomes over every batch.
type totals struct {
	mu sync.Mutex
	consumer.BatchStats
}

func (h *totals) BatchDone(_ context.Context, s *consumer.BatchStats) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Applied += s.Applied
	h.Duplicate += s.Duplicate
	h.Mismatch += s.Mismatch
	h.Parked += s.Parked
	h.Retried += s.Retried
}

// running is a Kafka consumer of the group in scope "ledger".
type running struct {
	cancel context.CancelFunc
	done   chan error
	src    *kafka.Source
	hook   *totals
}

func (e *kenv) start(h consumer.Handler) *running {
	e.t.Helper()
	return e.startScope(h, "ledger")
}

// startScope starts a consumer of the group whose markers are in scope.
func (e *kenv) startScope(h consumer.Handler, scope string) *running {
	e.t.Helper()
	src, err := kafka.New(e.pool, kafka.Config{
		Brokers: e.k.Brokers(), Group: e.group, Topics: []string{e.topic},
		MaxWait: kafkatest.MaxWait, SessionTimeout: kafkatest.SessionTimeout, HeartbeatInterval: kafkatest.HeartbeatInterval,
		RebalanceTimeout: 5 * time.Second, RevokeTimeout: 2 * time.Second, JoinGroupBackoff: 200 * time.Millisecond,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	s, err := idset.New(idset.Config{})
	if err != nil {
		e.t.Fatal(err)
	}
	r := &running{done: make(chan error, 1), src: src, hook: &totals{}}
	c, err := consumer.New(e.pool, src, consumer.Config{
		Name: "ledger", Scope: scope, Strategy: s, Handler: h, BatchSize: 25, RetryBackoff: time.Millisecond, Hooks: []consumer.Hook{r.hook},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- c.Run(ctx) }()
	return r
}

func (r *running) stop(t *testing.T) consumer.BatchStats {
	t.Helper()
	r.cancel()
	if err := <-r.done; err != nil {
		t.Fatal(err)
	}
	if err := r.src.Close(); err != nil {
		t.Fatal(err)
	}
	r.hook.mu.Lock()
	defer r.hook.mu.Unlock()
	return r.hook.BatchStats
}

// endOffsets returns the topic's end offset per partition.
func (e *kenv) endOffsets() map[int]int64 {
	e.t.Helper()
	c := &kafkago.Client{Addr: kafkago.TCP(e.k.Brokers()...), Timeout: 10 * time.Second}
	var reqs []kafkago.OffsetRequest
	for p := range e.partitions {
		reqs = append(reqs, kafkago.LastOffsetOf(p))
	}
	resp, err := c.ListOffsets(context.Background(), &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{e.topic: reqs}})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int]int64{}
	for _, po := range resp.Topics[e.topic] {
		out[po.Partition] = po.LastOffset
	}
	return out
}

// storedOffsets returns the group's next offsets stored in Postgres.
func (e *kenv) storedOffsets() map[int]int64 {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT partition, coalesce(next_offset, -1) FROM effectively.kafka_offsets WHERE group_id = $1 AND topic = $2`, e.group, e.topic)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	out := map[int]int64{}
	for rows.Next() {
		var p int32
		var o int64
		if err := rows.Scan(&p, &o); err != nil {
			e.t.Fatal(err)
		}
		out[int(p)] = o
	}
	return out
}

// drain runs a consumer until the stored offsets reach the topic's end.
func (e *kenv) drain(h consumer.Handler) consumer.BatchStats {
	e.t.Helper()
	return e.drainScope(h, "ledger")
}

func (e *kenv) drainScope(h consumer.Handler, scope string) consumer.BatchStats {
	e.t.Helper()
	r := e.startScope(h, scope)
	end := e.endOffsets()
	deadline := time.Now().Add(60 * time.Second)
	for {
		stored := e.storedOffsets()
		caught := true
		for p, o := range end {
			if stored[p] != o {
				caught = false
			}
		}
		if caught {
			break
		}
		if time.Now().After(deadline) {
			r.stop(e.t)
			e.t.Fatalf("the consumer did not catch up: stored %v, end %v", stored, end)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return r.stop(e.t)
}

func (e *kenv) dryRun(args ...string) cli.DryRunReport {
	e.t.Helper()
	r := e.must(stock, append([]string{"replay", "--brokers", strings.Join(e.k.Brokers(), ","), "--group", e.group, "--topic", e.topic,
		"--scope", "ledger", "--dry-run", "--json"}, args...)...)
	var rep cli.DryRunReport
	if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
		e.t.Fatalf("%v\n%s", err, r.out)
	}
	return rep
}

// Scenario (b): some messages were skipped (here the stored offsets were
// moved past them). The dry run of a replay from offset 0 counts the
// applied, parked and new messages; the replay then applies exactly the new
// ones and reports the others as duplicates, as the dry run said.
func TestReplayDryRunMatchesReplay(t *testing.T) {
	t.Parallel()
	e := newKenv(t, 2)
	base := time.Now().Add(-3 * time.Hour).Truncate(time.Millisecond)
	key := func(i int) string {
		switch i {
		case 11:
			return strings.Repeat("k", 600) // too long: parked as invalid_key
		case 21:
			return "k-20" // a producer duplicate of 20
		}
		return fmt.Sprintf("k-%d", i)
	}
	bad := func(i int) bool { return i == 7 } // parked by the handler, with a marker
	f := &fixable{}
	// Batch 1 is applied, but for 7 and 11 (parked) and 21 (duplicate).
	e.produce(0, 60, base, key, bad)
	st := e.drain(f.handle)
	if st.Applied != 57 || st.Parked != 2 || st.Duplicate != 1 {
		t.Fatalf("first run: %+v", st)
	}
	// Batch 2 is skipped: the offsets are moved past it, as a bad offset
	// reset would.
	e.produce(60, 100, base.Add(time.Hour), key, nil)
	for p, o := range e.endOffsets() {
		if _, err := e.pool.Exec(context.Background(), `UPDATE effectively.kafka_offsets SET next_offset = $3 WHERE group_id = $1 AND partition = $2`, e.group, p, o); err != nil {
			t.Fatal(err)
		}
	}
	// Batch 3 is applied.
	e.produce(100, 130, base.Add(2*time.Hour), key, nil)
	if st := e.drain(f.handle); st.Applied != 30 || st.Duplicate != 0 {
		t.Fatalf("second run: %+v", st)
	}
	if n := e.count(`SELECT count(*) FROM effects`); n != 87 {
		t.Fatalf("%d effects before the replay, want 87", n)
	}

	// From a time: batch 2 onwards, 70 messages of which 40 are new.
	rep := e.dryRun("--to-time", base.Add(30*time.Minute).Format(time.RFC3339Nano))
	for _, p := range rep.Plan {
		if p.Target != 30 || p.End != 65 || p.Stored == nil || *p.Stored != 65 {
			t.Fatalf("plan from a time: %+v", rep.Plan)
		}
	}
	if tt := rep.Total; tt.Messages != 70 || tt.New != 40 || tt.Applied != 30 || tt.Parked != 0 {
		t.Fatalf("dry run from a time: %+v", tt)
	}

	// From offset 0, with the progress bar.
	r := e.must(stock, "replay", "--brokers", strings.Join(e.k.Brokers(), ","), "--group", e.group, "--topic", e.topic,
		"--scope", "ledger", "--dry-run", "--to-offset", "0", "--progress", "always")
	if !strings.Contains(r.err, "100%") || !strings.Contains(r.err, "msg/s") || !strings.Contains(r.out, "nothing was written") {
		t.Fatalf("dry run output:\n%s\nstderr:\n%s", r.out, r.err)
	}
	rep = e.dryRun("--to-offset", "0")
	want := cli.DryRunCounts{
		Messages: 130, Applied: 88, Parked: 2, New: 40,
		ReplayApplied: 40, ReplayDuplicate: 89, ReplayParked: 1,
	}
	if rep.Total != want {
		t.Fatalf("dry run from 0:\n got %+v\nwant %+v", rep.Total, want)
	}
	if n := e.count(`SELECT count(*) FROM effectively.processed`); n != 88 {
		t.Fatalf("the dry run left %d markers, want the 88 it found", n)
	}
	for p, o := range e.storedOffsets() {
		if o != 65 {
			t.Fatalf("the dry run moved partition %d to %d", p, o)
		}
	}

	// A replay while a consumer of the group runs is refused.
	c := e.start(f.handle)
	waitMembers(t, e.k.Brokers(), e.group)
	_, err := e.run(stock, "", "replay", "--brokers", strings.Join(e.k.Brokers(), ","), "--group", e.group, "--topic", e.topic, "--to-offset", "0", "--yes")
	c.stop(t)
	if err == nil || !strings.Contains(err.Error(), "active member") {
		t.Fatalf("replay with a running consumer: %v", err)
	}
	for p, o := range e.storedOffsets() {
		if o != 65 {
			t.Fatalf("a refused replay moved partition %d to %d", p, o)
		}
	}
	// A replay forward is refused.
	if _, err := e.run(stock, "", "replay", "--brokers", strings.Join(e.k.Brokers(), ","), "--group", e.group, "--topic", e.topic, "--to-offset", "0=70", "--to-offset", "1=10", "--yes"); err == nil {
		t.Fatal("a replay past the end was accepted")
	}

	// The replay itself, once the group is empty.
	e.replay("--to-offset", "0")
	for p, o := range e.storedOffsets() {
		if o != 0 {
			t.Fatalf("partition %d stored at %d after the replay, want 0", p, o)
		}
	}
	st = e.drain(f.handle)
	if st.Applied != int(want.ReplayApplied) || st.Duplicate != int(want.ReplayDuplicate) || st.Parked != int(want.ReplayParked) || st.Mismatch != 0 {
		t.Fatalf("the replay reported %d applied, %d duplicate, %d parked; the dry run said %d, %d, %d",
			st.Applied, st.Duplicate, st.Parked, want.ReplayApplied, want.ReplayDuplicate, want.ReplayParked)
	}
	if n := e.count(`SELECT count(*) FROM effects`); n != 127 {
		t.Fatalf("%d effects after the replay, want 127", n)
	}
	if n := e.count(`SELECT count(*) FROM (SELECT msg_id FROM effects GROUP BY msg_id HAVING count(*) > 1) d`); n != 0 {
		t.Fatalf("%d messages applied twice", n)
	}
	if n := e.count(`SELECT count(*) FROM effectively.parked`); n != 2 {
		t.Fatalf("%d parked rows after the replay, want the same 2", n)
	}
}

// stats compares the stored offsets with the topic's end offsets.
func TestStatsKafkaLag(t *testing.T) {
	t.Parallel()
	e := newKenv(t, 2)
	key := func(i int) string { return fmt.Sprintf("k-%d", i) }
	e.produce(0, 20, time.Now(), key, nil)
	e.drain(insertEffect)
	e.produce(20, 30, time.Now(), key, nil)
	var rep cli.StatsReport
	r := e.must(stock, "stats", "--json", "--group", e.group, "--brokers", strings.Join(e.k.Brokers(), ","))
	if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, r.out)
	}
	if len(rep.KafkaOffsets) != 2 {
		t.Fatalf("offsets %+v", rep.KafkaOffsets)
	}
	for _, o := range rep.KafkaOffsets {
		if o.NextOffset == nil || *o.NextOffset != 10 || o.EndOffset == nil || *o.EndOffset != 15 || o.Lag == nil || *o.Lag != 5 {
			t.Fatalf("partition %d: %+v", o.Partition, o)
		}
	}
	r = e.must(stock, "stats", "--brokers", strings.Join(e.k.Brokers(), ","))
	if !strings.Contains(r.out, "LAG") || !strings.Contains(r.out, e.group) {
		t.Fatalf("stats table:\n%s", r.out)
	}
}

// replay moves the group's offsets with --yes, retrying while the group
// still lists the member of a consumer that just stopped.
func (e *kenv) replay(args ...string) {
	e.t.Helper()
	args = append([]string{"replay", "--brokers", strings.Join(e.k.Brokers(), ","), "--group", e.group, "--topic", e.topic, "--yes"}, args...)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := e.run(stock, "", args...)
		if err == nil {
			return
		}
		if !strings.Contains(err.Error(), "active member") || time.Now().After(deadline) {
			e.t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func waitMembers(t *testing.T, brokers []string, group string) {
	t.Helper()
	c := &kafkago.Client{Addr: kafkago.TCP(brokers...), Timeout: 10 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := c.DescribeGroups(context.Background(), &kafkago.DescribeGroupsRequest{GroupIDs: []string{group}})
		if err == nil && len(resp.Groups) == 1 && len(resp.Groups[0].Members) > 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the consumer never joined its group")
}
