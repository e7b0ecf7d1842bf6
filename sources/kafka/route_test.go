package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

// routeThirds sends partitions 0, 3, 6, … to database 0 and the others to
// database 1: not the default, so that Route is what decides.
func routeThirds(_ string, p int) int {
	if p%3 == 0 {
		return 0
	}
	return 1
}

// routedMember is one consumer of a routed group: its source, its engine
// and every partition its source was ever assigned.
type routedMember struct {
	name string
	db   int
	src  *Source
	run  *consumertest.Running
	hook *consumertest.Counter

	mu   sync.Mutex
	seen map[int]bool
}

func (m *routedMember) everAssigned() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []int
	for p := range m.seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// TestRouting: a topic of 6 partitions routed over two databases, each
// with its own consumers in one group. Members join and one leaves while
// messages, some sent twice by the producer, flow. Each database ends with
// exactly the effects of its partitions, each once, N in all; the offsets
// of a partition are stored only in its database; no member is ever
// assigned a partition of the other database.
func TestRouting(t *testing.T) {
	const partitions, n, dupEvery = 6, 3000, 7
	e := newEnv(t, partitions)
	pools := []*pgxpool.Pool{e.pool, pgtest.NewPool(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := pools[1].Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL, lane text NOT NULL, off bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	// Message i, key k-i, goes to partition i%partitions (the producer
	// partitions by key); every dupEvery-th is sent twice.
	records := make([]int64, partitions) // records produced per partition: its end offset
	produce := func(from, to int) {
		t.Helper()
		var msgs, dups []kafkago.Message
		for i := from; i < to; i++ {
			v := strconv.Itoa(i)
			m := kafkago.Message{Partition: i % partitions, Value: []byte(v),
				Headers: []kafkago.Header{{Key: DefaultIDHeader, Value: []byte("k-" + v)}}}
			msgs = append(msgs, m)
			records[m.Partition]++
			if i%dupEvery == 0 {
				dups = append(dups, m)
				records[m.Partition]++
			}
		}
		if err := e.kafka.Produce(ctx, e.topic, append(msgs, dups...)...); err != nil {
			t.Fatal(err)
		}
	}

	var members []*routedMember
	join := func(name string, db int) *routedMember {
		t.Helper()
		m := &routedMember{name: name, db: db, hook: &consumertest.Counter{}, seen: map[int]bool{}}
		cfg := e.config()
		cfg.Routing = &Routing{Databases: 2, Database: db, Route: routeThirds}
		cfg.OnAssigned = func(_ context.Context, tps []TopicPartition) {
			m.mu.Lock()
			defer m.mu.Unlock()
			for _, tp := range tps {
				m.seen[tp.Partition] = true
			}
		}
		src, err := New(pools[db], cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = src.Close() })
		m.src = src
		strategy, err := idset.New(idset.Config{})
		if err != nil {
			t.Fatal(err)
		}
		c := consumertest.NewConsumer(t, pools[db], src, consumer.Config{
			Name: "ledger", Strategy: strategy, BatchHandler: insertEffects, BatchSize: 200,
			Hooks: []consumer.Hook{m.hook}, Logger: testLogger(),
		})
		m.run = consumertest.Start(c)
		members = append(members, m)
		return m
	}
	owns := func(db int) []int {
		var out []int
		for p := range partitions {
			if routeThirds(e.topic, p) == db {
				out = append(out, p)
			}
		}
		return out
	}
	assigned := func(m *routedMember) []int {
		var out []int
		for _, l := range m.src.Assignment() {
			p, _ := strconv.Atoi(l[strings.LastIndexByte(l, '/')+1:])
			out = append(out, p)
		}
		slices.Sort(out)
		return out
	}
	// holds waits until the members, together, own exactly their
	// database's partitions, each owning at least one.
	holds := func(db int, ms ...*routedMember) {
		t.Helper()
		waitFor(t, 30*time.Second, fmt.Sprintf("database %d's partitions held by %d members", db, len(ms)), func() bool {
			var all []int
			for _, m := range ms {
				a := assigned(m)
				if len(a) == 0 {
					return false
				}
				all = append(all, a...)
			}
			slices.Sort(all)
			return slices.Equal(all, owns(db))
		})
	}

	a0, b0 := join("a0", 0), join("b0", 1)
	holds(0, a0)
	holds(1, b0)
	produce(0, n/3)

	b1 := join("b1", 1) // a member joins database 1 while messages flow: the group rebalances
	produce(n/3, 2*n/3)
	holds(1, b0, b1)
	a1 := join("a1", 0)
	holds(0, a0, a1)

	produce(2*n/3, n)
	a0.run.Stop(t) // a member of database 0 leaves: a1 takes its partition over
	_ = a0.src.Close()
	holds(0, a1)

	// Done when each database stored, for each of its partitions, the end
	// of the partition's log as its next offset.
	waitFor(t, 30*time.Second, "every partition's end offset stored in its database", func() bool {
		for db, pool := range pools {
			got := routedOffsets(t, pool, e.group, e.topic)
			for _, p := range owns(db) {
				if got[p] != records[p] {
					return false
				}
			}
		}
		return true
	})
	for _, m := range []*routedMember{b0, b1, a1} {
		m.run.Stop(t)
	}

	total := 0
	for db, pool := range pools {
		// Exactly this database's messages, each once.
		var want []string
		for i := range n {
			if routeThirds(e.topic, i%partitions) == db {
				want = append(want, "k-"+strconv.Itoa(i))
			}
		}
		got := consumertest.EffectCounts(t, pool, "effects", "msg_id")
		for _, id := range want {
			if got[id] != 1 {
				t.Errorf("database %d: %d effects of %s, want 1", db, got[id], id)
			}
		}
		if len(got) != len(want) {
			t.Errorf("database %d: effects of %d messages, want %d (its partitions' only)", db, len(got), len(want))
		}
		total += len(got)
		// Offsets of its partitions only.
		offs := routedOffsets(t, pool, e.group, e.topic)
		for p, next := range offs {
			if routeThirds(e.topic, p) != db {
				t.Errorf("database %d stores offset %d of partition %d, which routes to the other database", db, next, p)
			}
		}
	}
	if total != n {
		t.Errorf("%d messages applied across the databases, want %d", total, n)
	}
	var applied, dups int
	for _, m := range members {
		for _, p := range m.everAssigned() {
			if routeThirds(e.topic, p) != m.db {
				t.Errorf("member %s of database %d was assigned partition %d of the other database", m.name, m.db, p)
			}
		}
		tot := m.hook.Total()
		applied += tot.Applied
		dups += tot.Duplicate
	}
	if applied != n || dups < (n+dupEvery-1)/dupEvery {
		t.Errorf("applied %d, duplicates %d: want %d applied and at least %d duplicates", applied, dups, n, (n+dupEvery-1)/dupEvery)
	}
	t.Logf("records per partition %v; members' partitions: a0 %v, a1 %v, b0 %v, b1 %v",
		records, a0.everAssigned(), a1.everAssigned(), b0.everAssigned(), b1.everAssigned())
}

// routedOffsets returns the next offsets stored in pool for group's
// partitions of topic.
func routedOffsets(t *testing.T, pool *pgxpool.Pool, group, topic string) map[int]int64 {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT partition, coalesce(next_offset, -1) FROM effectively.kafka_offsets WHERE group_id = $1 AND topic = $2`, group, topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int]int64{}
	for rows.Next() {
		var p int
		var next int64
		if err := rows.Scan(&p, &next); err != nil {
			t.Fatal(err)
		}
		out[p] = next
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRouteBalancer: the leader's assignment gives each partition to a
// member of its database, round robin, and nothing to a member that
// announces another number of databases; a partition routed out of range,
// or to a database without members, is assigned to no one.
func TestRouteBalancer(t *testing.T) {
	s, err := New(nil, Config{Brokers: []string{"localhost:9092"}, Group: "g", Topics: []string{"t"},
		KafkaOffsetsOnly: true, Logger: testLogger(),
		Routing: &Routing{Databases: 3, Route: func(_ string, p int) int {
			if p == 7 {
				return 5 // out of range
			}
			return p % 3
		}}})
	if err != nil {
		t.Fatal(err)
	}
	member := func(id string, databases, db int) kafkago.GroupMember {
		r := Routing{Databases: databases, Database: db}
		return kafkago.GroupMember{ID: id, Topics: []string{"t"}, UserData: r.userData()}
	}
	members := []kafkago.GroupMember{
		member("m-b", 3, 0), member("m-a", 3, 0), member("m-c", 3, 1),
		member("m-wrong", 2, 1), // another routing: given nothing
		{ID: "m-old", Topics: []string{"t"}, UserData: []byte("zone-a")},
	}
	var parts []kafkago.Partition
	for p := range 9 {
		parts = append(parts, kafkago.Partition{Topic: "t", ID: p})
	}
	got := routeBalancer{s}.AssignGroups(members, parts)
	want := kafkago.GroupMemberAssignments{
		"m-a":     {"t": {0, 6}}, // database 0: 0, 3, 6 round robin over m-a, m-b
		"m-b":     {"t": {3}},
		"m-c":     {"t": {1, 4}}, // database 1: 1, 4 (7 is out of range)
		"m-wrong": {},
		"m-old":   {}, // database 2 (2, 5, 8) has no member
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("assignment\n got %v\nwant %v", got, want)
	}

	// A member refuses what its own Route sends elsewhere.
	s.cfg.Routing.Database = 1
	kept := s.routed(1, []topicPartition{{"t", 0}, {"t", 1}, {"t", 2}, {"t", 4}})
	if fmt.Sprint(kept) != fmt.Sprint([]topicPartition{{"t", 1}, {"t", 4}}) {
		t.Fatalf("kept %v, want t/1 and t/4", kept)
	}
}

// TestRoutingConfig: a bad Routing is refused by New with a clear error.
func TestRoutingConfig(t *testing.T) {
	for _, tc := range []struct {
		r     Routing
		field string
	}{
		{Routing{}, "Routing.Databases"},
		{Routing{Databases: 2, Database: 2}, "Routing.Database"},
		{Routing{Databases: 2, Database: -1}, "Routing.Database"},
	} {
		_, err := New(nil, Config{Brokers: []string{"b:9092"}, Group: "g", Topics: []string{"t"}, KafkaOffsetsOnly: true, Routing: &tc.r})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || !errors.Is(err, pg.ErrInvalidConfig) {
			t.Errorf("Routing %+v: got %v, want a ConfigError of %s", tc.r, err, tc.field)
		}
	}
	r := Routing{Databases: 4, Database: 3}
	s, err := New(nil, Config{Brokers: []string{"b:9092"}, Group: "g", Topics: []string{"t"}, KafkaOffsetsOnly: true, Routing: &r})
	if err != nil {
		t.Fatal(err)
	}
	r.Database = 0 // the source keeps its own copy
	if s.cfg.Routing.route("t", 7) != 3 || s.cfg.Routing.Database != 3 {
		t.Errorf("default Route or copy: route(7) = %d, Database %d", s.cfg.Routing.route("t", 7), s.cfg.Routing.Database)
	}
}

// TestRoutingRefusesUnroutedMember: a source without Routing that joins a
// routed group (a misconfigured deployment) is refused by the coordinator,
// since no protocol is common to both, and is given no partition; Fetch
// reports why.
func TestRoutingRefusesUnroutedMember(t *testing.T) {
	e := newEnv(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	routed := e.source(func(c *Config) { c.Routing = &Routing{Databases: 1} })
	waitFor(t, 30*time.Second, "the routed member's assignment", func() bool {
		fctx, fcancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer fcancel()
		_, _ = routed.Fetch(fctx, 1) // starts it
		return len(routed.Assignment()) == 2
	})
	plain := e.source()
	_, err := plain.Fetch(ctx, 10)
	if !errors.Is(err, kafkago.InconsistentGroupProtocol) {
		t.Fatalf("Fetch of a member without Routing: got %v, want InconsistentGroupProtocol", err)
	}
	if a := plain.Assignment(); len(a) != 0 {
		t.Fatalf("member without Routing was assigned %v", a)
	}
	if a := routed.Assignment(); len(a) != 2 {
		t.Fatalf("routed member holds %v, want both partitions", a)
	}
}
