package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	kafka "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The in-process cluster applies the session rule of Kafka's classic
// consumer group protocol that kfake misses.
//
// Kafka's coordinator schedules every member's session expiry afresh when
// a rebalance's join phase completes, whether or not the member's
// JoinGroup response reached it, and drops a member that then sends
// nothing (no SyncGroup, heartbeat or offset commit) for its session
// timeout; a member waiting in SyncGroup for the leader is kept alive
// (Kafka's GroupCoordinator, MemberMetadata.shouldKeepAlive). kfake arms a
// member's session timer only when a response to it was handed to its
// connection, and a member that joined in the rebalance has no timer
// before that: a member that was closed (or whose process died) while its
// JoinGroup waited in the coordinator is counted as joined, is assigned
// partitions, and then stays in the group with no session timer, holding
// them, until some other member joins and that rebalance's
// RebalanceTimeout drops it. kafka-go's ConsumerGroup does not leave the
// group when it is closed in a JoinGroup (it has no member ID to leave
// with then), so a test that closes one consumer while another joins
// could leave a partition unconsumed for good.
//
// The session keeper applies Kafka's rule from the outside: it watches the
// group requests (a kfake control function that only observes) and reads
// the groups' state every sessionPoll; a member that sent nothing for its
// session timeout since the later of its last request and the completion
// of the last join phase is removed with a LeaveGroup request, which kfake
// handles as its own session expiry: in a Stable group, in a completing
// rebalance unless it waits in SyncGroup, and in a rebalance being
// prepared unless it waits in JoinGroup (see expires). kfake's eviction of
// members waiting in a long join phase stays: with dead members dropped on
// time, a join phase outlasts a session only when a live member takes
// that long to leave its generation, and the evicted members hold no
// partitions meanwhile.

// sessionPoll is how often the session keeper reads the groups' state:
// the resolution of its session expiry.
const sessionPoll = 100 * time.Millisecond

// keeper applies Kafka's session expiry to the classic groups of an
// in-process cluster.
type keeper struct {
	info  func(group string) (state string, members []string, ok bool)
	leave func(ctx context.Context, group, member string) error

	mu     sync.Mutex
	log    io.Writer
	groups map[string]*groupTrack

	cancel context.CancelFunc
	done   chan struct{}
}

type groupTrack struct {
	session time.Duration // the members' session timeout, from their JoinGroup requests
	settled bool          // Stable or CompletingRebalance when last read
	members map[string]*memberTrack
}

type memberTrack struct {
	seen    time.Time // its last request, or the completion of the join phase
	syncing bool      // its last request was a SyncGroup
	joining bool      // its last request was a JoinGroup with its member ID
	settled bool      // it was a member of a generation (read Stable or CompletingRebalance)
}

// startKeeper starts a session keeper that reads the groups with info and
// removes members with leave; the caller feeds it the cluster's requests
// with observe.
func startKeeper(info func(group string) (string, []string, bool), leave func(ctx context.Context, group, member string) error) *keeper {
	ctx, cancel := context.WithCancel(context.Background())
	k := &keeper{info: info, leave: leave, log: io.Discard, groups: map[string]*groupTrack{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(k.done)
		k.run(ctx)
	}()
	return k
}

// stop stops the keeper and waits for it.
func (k *keeper) stop() {
	k.cancel()
	<-k.done
}

// setLog makes the keeper report the members it drops to w.
func (k *keeper) setLog(w io.Writer) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.log = w
}

func (k *keeper) group(name string) *groupTrack {
	g := k.groups[name]
	if g == nil {
		g = &groupTrack{members: map[string]*memberTrack{}}
		k.groups[name] = g
	}
	return g
}

// observe notes a request of a group member. It runs in kfake's request
// loop, and so never waits on the cluster.
func (k *keeper) observe(req kmsg.Request) {
	var group, member string
	syncing, joining := false, false
	session := time.Duration(0)
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		group, member, joining = r.Group, r.MemberID, true
		session = time.Duration(r.SessionTimeoutMillis) * time.Millisecond
	case *kmsg.SyncGroupRequest:
		group, member, syncing = r.Group, r.MemberID, true
	case *kmsg.HeartbeatRequest:
		group, member = r.Group, r.MemberID
	case *kmsg.OffsetCommitRequest:
		group, member = r.Group, r.MemberID
	default:
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	g := k.group(group)
	g.session = max(g.session, session)
	if member == "" {
		return
	}
	m := g.members[member]
	if m == nil {
		m = &memberTrack{}
		g.members[member] = m
	}
	m.seen, m.syncing, m.joining = time.Now(), syncing, joining
}

func (k *keeper) run(ctx context.Context) {
	tick := time.NewTicker(sessionPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		k.sweep(ctx)
	}
}

// sweep reads the groups and drops the members whose session expired.
func (k *keeper) sweep(ctx context.Context) {
	k.mu.Lock()
	names := make([]string, 0, len(k.groups))
	for name := range k.groups {
		names = append(names, name)
	}
	k.mu.Unlock()
	// Read without k.mu: the cluster answers from its request loop,
	// which may be waiting in observe for k.mu.
	type read struct {
		state   string
		members []string
	}
	reads := make(map[string]read, len(names))
	for _, name := range names {
		if state, members, ok := k.info(name); ok {
			reads[name] = read{state, members}
		}
	}
	type expired struct {
		group, member string
		silent        time.Duration
	}
	var drop []expired
	now := time.Now()
	k.mu.Lock()
	for name, r := range reads {
		g := k.groups[name]
		settled := r.state == "Stable" || r.state == "CompletingRebalance"
		joined := settled && !g.settled // the join phase completed since the last read
		g.settled = settled
		listed := make(map[string]bool, len(r.members))
		for _, id := range r.members {
			listed[id] = true
			m := g.members[id]
			if m == nil {
				// A member that joined with no member ID and has sent
				// nothing since: its session starts now at the latest.
				m = &memberTrack{seen: now}
				g.members[id] = m
			}
			if joined {
				// The join phase answered every member's JoinGroup and
				// scheduled its session expiry afresh.
				m.seen, m.joining, m.syncing = now, false, false
			}
			if settled {
				m.settled = true
			}
			if !expires(r.state, m) || g.session <= 0 {
				continue
			}
			if silent := now.Sub(m.seen); silent > g.session {
				drop = append(drop, expired{name, id, silent})
			}
		}
		for id := range g.members {
			if !listed[id] {
				delete(g.members, id)
			}
		}
	}
	k.mu.Unlock()
	for _, e := range drop {
		k.drop(ctx, e.group, e.member, e.silent)
	}
}

// expires reports whether m's session runs while its group is in state,
// as in Kafka: in a Stable group, in a completing rebalance unless it
// waits in SyncGroup, and in a rebalance being prepared unless it waits in
// JoinGroup. A member that joined the group in the rebalance being
// prepared (with no member ID, as kafka-go joins) is left to kfake, which
// drops it at the rebalance timeout if it is gone.
func expires(state string, m *memberTrack) bool {
	switch state {
	case "Stable":
		return true
	case "CompletingRebalance":
		return !m.syncing
	case "PreparingRebalance":
		return m.settled && !m.joining
	}
	return false
}

// drop removes member from group, as kfake's session expiry does, unless
// a request revived it meanwhile.
func (k *keeper) drop(ctx context.Context, group, member string, silent time.Duration) {
	k.mu.Lock()
	g := k.groups[group]
	m := g.members[member]
	gone := m != nil && time.Since(m.seen) > g.session
	if gone {
		delete(g.members, member)
	}
	log := k.log
	k.mu.Unlock()
	if !gone {
		return
	}
	err := k.leave(ctx, group, member)
	switch {
	case errors.Is(err, kafka.UnknownMemberId):
		// kfake's own session timer dropped it first.
	case err != nil:
		fmt.Fprintf(log, "kafkatest: dropping member %s of group %s after its session timeout: %v\n", member, group, err)
	default:
		fmt.Fprintf(log, "kafkatest: member %s of group %s sent nothing for %s since its last request or the completion of its join: dropped (session timeout)\n",
			member, group, silent.Round(time.Millisecond))
	}
}
