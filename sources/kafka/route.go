package kafka

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/effectively-once/effectively/pg"
	kafkago "github.com/segmentio/kafka-go"
)

// RouteProtocol is the consumer group protocol (the balancer's name) that
// sources with Config.Routing announce. Members without Routing announce
// "range" and "roundrobin" instead, so the coordinator refuses to mix the
// two kinds in one group (kafka-go reports InconsistentGroupProtocol).
const RouteProtocol = "effectively-route"

// Routing spreads a consumer group's partitions over several PostgreSQL
// databases: each partition belongs to one database, chosen by Route, and
// is only ever assigned to a source of that database. Run one consumer per
// database, each over its own Source in the same Group, with the same
// Databases and Route and its own Database. A partition's effects, dedupe
// markers and stored offsets then live in its database alone, so every
// batch stays one local transaction; a key's duplicates meet in one
// database when the producer partitions by key. See docs/scaling.md.
//
// The group's leader assigns each partition to the members that announced
// its database (round robin over them, in member order), and none when no
// member of that database is in the group: such a partition waits, and is
// logged, until one joins. A member given a partition that its own Route
// sends elsewhere (members disagree on Route) refuses it and logs an
// error, so it is never claimed or consumed in the wrong database. Changing
// Route for a partition that was already consumed moves it to a database
// that holds neither its offsets nor its markers: do not, unless those are
// moved too.
type Routing struct {
	// Databases is how many databases the group's partitions are spread
	// over; every member must agree on it (the leader assigns nothing to a
	// member that announces another count). Required: at least 1.
	Databases int
	// Database is the index of this source's database, from 0 to
	// Databases-1.
	Database int
	// Route returns the index of the database (0 to Databases-1) that holds
	// a partition of topic. It must be the same function in every member,
	// and stable: a partition must not change databases. A partition it
	// routes out of range is assigned to no member (and logged). Defaults
	// to partition % Databases.
	Route func(topic string, partition int) int
}

// route returns the database of a partition.
func (r *Routing) route(topic string, partition int) int {
	if r.Route == nil {
		return partition % r.Databases
	}
	return r.Route(topic, partition)
}

func (r *Routing) validate() error {
	switch {
	case r.Databases < 1:
		return pg.ConfigErrorf("kafka", "Routing.Databases", "must be at least 1, got %d", r.Databases)
	case r.Database < 0 || r.Database >= r.Databases:
		return pg.ConfigErrorf("kafka", "Routing.Database", "must be from 0 to %d (Databases-1), got %d", r.Databases-1, r.Database)
	}
	return nil
}

// userData is what a member announces in its group metadata: a
// version byte, then Databases and Database as big-endian uint32s.
func (r *Routing) userData() []byte {
	b := make([]byte, 9)
	b[0] = 1
	binary.BigEndian.PutUint32(b[1:], uint32(r.Databases))
	binary.BigEndian.PutUint32(b[5:], uint32(r.Database))
	return b
}

func parseRouteUserData(b []byte) (databases, database int, err error) {
	if len(b) != 9 || b[0] != 1 {
		return 0, 0, fmt.Errorf("unknown routing metadata %x", b)
	}
	return int(binary.BigEndian.Uint32(b[1:])), int(binary.BigEndian.Uint32(b[5:])), nil
}

// routeBalancer is the kafka-go GroupBalancer of sources with Routing.
type routeBalancer struct{ s *Source }

func (b routeBalancer) ProtocolName() string { return RouteProtocol }

func (b routeBalancer) UserData() ([]byte, error) { return b.s.cfg.Routing.userData(), nil }

// AssignGroups gives each partition to a member of its database that
// subscribes its topic, round robin in member ID order, and leaves
// unassigned the partitions whose database has no such member.
func (b routeBalancer) AssignGroups(members []kafkago.GroupMember, partitions []kafkago.Partition) kafkago.GroupMemberAssignments {
	s, r := b.s, b.s.cfg.Routing
	out := kafkago.GroupMemberAssignments{}
	byDB := map[int][]kafkago.GroupMember{}
	for _, m := range members {
		out[m.ID] = map[string][]int{}
		n, db, err := parseRouteUserData(m.UserData)
		if err == nil && (n != r.Databases || db < 0 || db >= n) {
			err = fmt.Errorf("it announces database %d of %d, this group routes over %d", db, n, r.Databases)
		}
		if err != nil {
			s.log.Error("kafka: routing: assigning nothing to a member", "group", s.cfg.Group, "member", m.ID, "err", err)
			continue
		}
		byDB[db] = append(byDB[db], m)
	}
	for _, ms := range byDB {
		slices.SortFunc(ms, func(a, b kafkago.GroupMember) int { return strings.Compare(a.ID, b.ID) })
	}
	partitions = slices.Clone(partitions)
	slices.SortFunc(partitions, func(a, b kafkago.Partition) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.ID, b.ID))
	})
	next := map[int]int{}
	var unserved []string
	for _, p := range partitions {
		db := r.route(p.Topic, p.ID)
		if db < 0 || db >= r.Databases {
			s.log.Error("kafka: routing: Route returned a database out of range; the partition is not consumed",
				"group", s.cfg.Group, "partition", laneName(p.Topic, p.ID), "database", db, "databases", r.Databases)
			continue
		}
		var candidates []string
		for _, m := range byDB[db] {
			if slices.Contains(m.Topics, p.Topic) {
				candidates = append(candidates, m.ID)
			}
		}
		if len(candidates) == 0 {
			unserved = append(unserved, fmt.Sprintf("%s→%d", laneName(p.Topic, p.ID), db))
			continue
		}
		m := candidates[next[db]%len(candidates)]
		next[db]++
		out[m][p.Topic] = append(out[m][p.Topic], p.ID)
	}
	if len(unserved) > 0 {
		s.log.Warn("kafka: routing: partitions wait for a member of their database to join the group",
			"group", s.cfg.Group, "partitions", unserved)
	}
	return out
}

// groupBalancers returns the balancers the source offers the group: the
// routing one with Routing, else range and round robin.
func (s *Source) groupBalancers() []kafkago.GroupBalancer {
	if s.cfg.Routing == nil {
		return s.balancers()
	}
	return []kafkago.GroupBalancer{leaderBalancer{routeBalancer{s}, s}}
}

// routed returns the partitions of an assignment that belong to this
// source's database, and logs as an error those it refuses: a leader whose
// Route differs from this member's gave them. They are neither claimed nor
// consumed here, so no offset of theirs is written to this database.
func (s *Source) routed(gen int32, tps []topicPartition) []topicPartition {
	r := s.cfg.Routing
	if r == nil {
		return tps
	}
	var kept []topicPartition
	var refused []string
	for _, tp := range tps {
		if r.route(tp.topic, tp.partition) == r.Database {
			kept = append(kept, tp)
		} else {
			refused = append(refused, laneName(tp.topic, tp.partition))
		}
	}
	if len(refused) > 0 {
		s.log.Error("kafka: routing: refusing partitions that Route sends to another database (do the group's members use the same Route?)",
			"group", s.cfg.Group, "generation", gen, "database", r.Database, "partitions", refused)
	}
	return kept
}
