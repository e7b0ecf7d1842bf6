package franz

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/twmb/franz-go/pkg/kgo"
)

// handover is how soon the partitions of a member that closed cleanly are
// consumed by another: the leave makes the coordinator rebalance at once,
// and the others notice within a heartbeat (200ms in the tests). Without
// the leave they would wait for the session timeout (6s in the tests).
const handover = time.Second

// produceTo writes one new message to each of lanes and returns their IDs.
func (e *env) produceTo(tag string, lanes []string) []string {
	e.t.Helper()
	var ids []string
	var recs []*kgo.Record
	for _, l := range lanes {
		var topic string
		var p int
		if _, err := fmt.Sscanf(l, e.topic+"/%d", &p); err != nil {
			e.t.Fatalf("lane %q: %v", l, err)
		}
		topic = e.topic
		id := tag + "-" + strconv.Itoa(p)
		ids = append(ids, id)
		recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(p), Value: []byte(id),
			Headers: []kgo.RecordHeader{{Key: DefaultIDHeader, Value: []byte(id)}}})
	}
	e.produceRecords(recs...)
	return ids
}

// applied returns how many of ids have an effect.
func (e *env) applied(ids []string) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(DISTINCT msg_id) FROM effects WHERE msg_id = ANY($1)`, ids).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// TestCleanStopHandsOver: of two members, one stops cleanly (the
// consumer's Run ends, then Close); a new message on each of its
// partitions is applied by the other within handover of the Close, for a
// dynamic member (kgo's leave) and for a static one (Config.InstanceID:
// Kafka's static members do not leave by default, so Close leaves
// explicitly).
func TestCleanStopHandsOver(t *testing.T) {
	for _, static := range []bool{false, true} {
		t.Run(map[bool]string{false: "dynamic", true: "static"}[static], func(t *testing.T) {
			e := newEnv(t, 4)
			e.produce(0, 40)
			h := &consumertest.Counter{}
			id := func(name string) func(*Config) {
				return func(c *Config) {
					if static {
						c.InstanceID = name
					}
				}
			}
			aSrc, bSrc := e.source(id("a")), e.source(id("b"))
			a := consumertest.Start(e.engine(aSrc, h))
			b := consumertest.Start(e.engine(bSrc, h))
			defer b.Stop(t)
			waitFor(t, time.Minute, "both members to own partitions and the first messages applied", func() bool {
				_, d := e.effects()
				return len(aSrc.Assignment()) > 0 && len(bSrc.Assignment()) > 0 && len(aSrc.Assignment())+len(bSrc.Assignment()) == 4 && d == 40
			})
			moving := aSrc.Assignment()
			a.Stop(t)
			ids := e.produceTo("after-stop", moving)
			start := time.Now()
			if err := aSrc.Close(); err != nil {
				t.Fatal(err)
			}
			waitFor(t, time.Minute, "the other member to apply the new messages", func() bool { return e.applied(ids) == len(ids) })
			took := time.Since(start)
			t.Logf("%d partitions (%v) handed over and their new messages applied %s after Close began", len(moving), moving, took.Round(time.Millisecond))
			if took > handover {
				t.Errorf("the new messages of the closed member's partitions were applied %s after Close began, want within %s", took.Round(time.Millisecond), handover)
			}
			if got := bSrc.Assignment(); len(got) != 4 {
				t.Errorf("the remaining member owns %v, want all 4 partitions", got)
			}
		})
	}
}

// TestFencedInstanceStops: a second process joins with the instance ID of
// a live member (a replacement started while the old one still runs);
// the coordinator fences the old one, whose Run stops with an error
// matching ErrFencedInstance instead of rejoining, and the new one
// consumes every partition.
func TestFencedInstanceStops(t *testing.T) {
	e := newEnv(t, 2)
	e.produce(0, 20)
	h := &consumertest.Counter{}
	same := func(c *Config) { c.InstanceID = "worker-1" }
	oldSrc := e.source(same)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	oldDone := make(chan error, 1)
	oldC := e.engine(oldSrc, h)
	go func() { oldDone <- oldC.Run(ctx) }()
	waitFor(t, time.Minute, "the first member to apply the first messages", func() bool { _, d := e.effects(); return d == 20 })

	newSrc := e.source(same)
	n := consumertest.Start(e.engine(newSrc, h))
	defer n.Stop(t)
	select {
	case err := <-oldDone:
		if !errors.Is(err, ErrFencedInstance) {
			t.Fatalf("the fenced member's Run returned %v, want an error matching ErrFencedInstance", err)
		}
		t.Logf("the fenced member stopped: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the fenced member's Run did not stop within a minute")
	}
	_ = oldSrc.Close() // sends no LeaveGroup: the instance ID is the new member's
	ids := e.produceTo("after-fence", []string{e.topic + "/0", e.topic + "/1"})
	waitFor(t, time.Minute, "the new member to apply a new message on each partition", func() bool { return e.applied(ids) == len(ids) })
	if got := newSrc.Assignment(); len(got) != 2 {
		t.Errorf("the new member owns %v, want both partitions", got)
	}
	if rows, d := e.effects(); rows != d {
		t.Errorf("%d effect rows for %d distinct messages", rows, d)
	}
}

// TestInstanceIDConfig: an instance ID Kafka would refuse, or one that
// contradicts kgo.InstanceID in Opts, is refused by New.
func TestInstanceIDConfig(t *testing.T) {
	base := Config{Brokers: []string{"127.0.0.1:1"}, Group: "g", Topics: []string{"t"}, KafkaOffsetsOnly: true}
	for name, mutate := range map[string]func(*Config){
		"bad character": func(c *Config) { c.InstanceID = "worker 1" },
		"too long":      func(c *Config) { c.InstanceID = strings.Repeat("w", 250) },
		"contradiction": func(c *Config) { c.InstanceID = "a"; c.Opts = []kgo.Opt{kgo.InstanceID("b")} },
	} {
		cfg := base
		mutate(&cfg)
		if _, err := New(nil, cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: New returned %v, want ErrInvalidConfig", name, err)
		}
	}
	fromConfig, fromOpts := base, base
	fromConfig.InstanceID = "pod-0.ledger_1"
	fromOpts.Opts = []kgo.Opt{kgo.InstanceID("pod-0")}
	for want, cfg := range map[string]Config{"pod-0.ledger_1": fromConfig, "pod-0": fromOpts} {
		s, err := New(nil, cfg)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		if s.instanceID != want {
			t.Errorf("instance ID %q, want %q", s.instanceID, want)
		}
	}
}
