// Package broker is the Kafka broker of the chaos runs: franz-go's kfake,
// with the session rule of Kafka's classic consumer group protocol that
// kfake misses and that the runs' stall bounds rest on.
//
// Kafka's coordinator schedules every member's session expiry afresh when
// a rebalance's join phase completes, whether or not the member's
// JoinGroup response reached it, and drops a member that then sends
// nothing (no SyncGroup, heartbeat or offset commit) for its session
// timeout; a member waiting in SyncGroup for the leader is kept alive
// (Kafka's GroupCoordinator, MemberMetadata.shouldKeepAlive). kfake arms a
// member's session timer only when a response to it was handed to its
// connection, and a member that joined in the rebalance has no timer
// before that: a member whose process died while its JoinGroup was
// waiting in the coordinator is counted as joined, is assigned partitions,
// and then stays in the group with no session timer, holding them, until
// some other member joins and that rebalance's RebalanceTimeout drops it.
// Meanwhile the members waiting in that join are expired by kfake's
// session timers (it does not keep a member awaiting its join alive, as
// Kafka does) and their JoinGroup is never answered, so each waits for
// its client's own timeout before joining again. In the chaos run a kill
// that landed while the victim's JoinGroup was waiting (the first kill,
// while the workers were still joining, or any kill during a rebalance)
// left its partitions stalled until the next kill, a minute later; a
// replacement that joined soon after cost RebalanceTimeout plus a
// SessionTimeout of evictions (17s).
//
// New starts kfake and a session keeper beside it that applies Kafka's
// rule from the outside: it watches the group requests (a kfake control
// function that only observes) and describes the groups every
// sessionPoll; a member that sent nothing for its session timeout since
// the later of its last request and the completion of the last join phase
// is removed with a LeaveGroup request, which kfake handles as its own
// session expiry: in a Stable group, in a completing rebalance unless it
// waits in SyncGroup, and in a rebalance being prepared unless it waits in
// JoinGroup (see expires). kfake's eviction of members waiting in a long
// join phase stays: with dead members dropped on time, a join phase
// outlasts a session only when a live member takes that long to leave its
// generation, and the evicted members hold no partitions meanwhile.
package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// sessionPoll is how often the session keeper describes the groups: the
// resolution of its session expiry.
const sessionPoll = 100 * time.Millisecond

// Cluster is a kfake cluster with its session keeper.
type Cluster struct {
	*kfake.Cluster
	keeper *keeper
	cancel context.CancelFunc
	done   chan struct{}
}

// New starts a kfake cluster with opts and its session keeper, which logs
// the members it drops to log (nil for none).
func New(log io.Writer, opts ...kfake.Opt) (*Cluster, error) {
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		c.Close()
		return nil, err
	}
	if log == nil {
		log = io.Discard
	}
	k := &keeper{cl: cl, log: log, groups: map[string]*groupTrack{}}
	c.Control(func(req kmsg.Request) (kmsg.Response, error, bool) {
		k.observe(req)
		return nil, nil, false // observe only: kfake handles every request
	})
	ctx, cancel := context.WithCancel(context.Background())
	out := &Cluster{Cluster: c, keeper: k, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(out.done)
		k.run(ctx)
	}()
	return out, nil
}

// Close stops the session keeper and the cluster.
func (c *Cluster) Close() {
	c.cancel()
	<-c.done
	c.keeper.cl.Close()
	c.Cluster.Close()
}

// keeper applies Kafka's session expiry to the classic groups of a kfake
// cluster.
type keeper struct {
	cl  *kgo.Client
	log io.Writer

	mu     sync.Mutex
	groups map[string]*groupTrack
}

type groupTrack struct {
	session time.Duration // the members' session timeout, from their JoinGroup requests
	settled bool          // Stable or CompletingRebalance at the last description
	members map[string]*memberTrack
}

type memberTrack struct {
	seen    time.Time // its last request, or the completion of the join phase
	syncing bool      // its last request was a SyncGroup
	joining bool      // its last request was a JoinGroup with its member ID
	settled bool      // it was a member of a generation (described Stable or CompletingRebalance)
}

func (k *keeper) group(name string) *groupTrack {
	g := k.groups[name]
	if g == nil {
		g = &groupTrack{members: map[string]*memberTrack{}}
		k.groups[name] = g
	}
	return g
}

// observe notes a request of a group member.
func (k *keeper) observe(req kmsg.Request) {
	var group, member string
	syncing, joining := false, false
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		k.mu.Lock()
		g := k.group(r.Group)
		g.session = max(g.session, time.Duration(r.SessionTimeoutMillis)*time.Millisecond)
		k.mu.Unlock()
		group, member, joining = r.Group, r.MemberID, true
	case *kmsg.SyncGroupRequest:
		group, member, syncing = r.Group, r.MemberID, true
	case *kmsg.HeartbeatRequest:
		group, member = r.Group, r.MemberID
	case *kmsg.OffsetCommitRequest:
		group, member = r.Group, r.MemberID
	default:
		return
	}
	if member == "" {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	g := k.group(group)
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

// sweep describes the groups and drops the members whose session expired.
func (k *keeper) sweep(ctx context.Context) {
	k.mu.Lock()
	names := make([]string, 0, len(k.groups))
	for name := range k.groups {
		names = append(names, name)
	}
	k.mu.Unlock()
	if len(names) == 0 {
		return
	}
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = names
	shards := k.cl.RequestSharded(ctx, req)
	type expired struct {
		group, member string
		silent        time.Duration
	}
	var drop []expired
	now := time.Now()
	k.mu.Lock()
	for _, sh := range shards {
		if sh.Err != nil {
			continue
		}
		for _, dg := range sh.Resp.(*kmsg.DescribeGroupsResponse).Groups {
			g := k.groups[dg.Group]
			if g == nil || dg.ErrorCode != 0 {
				continue
			}
			settled := dg.State == "Stable" || dg.State == "CompletingRebalance"
			joined := settled && !g.settled // the join phase completed since the last description
			g.settled = settled
			listed := map[string]bool{}
			for _, dm := range dg.Members {
				listed[dm.MemberID] = true
				m := g.members[dm.MemberID]
				if m == nil {
					// A member that joined with no member ID and has sent
					// nothing since: its session starts now at the latest.
					m = &memberTrack{seen: now}
					g.members[dm.MemberID] = m
				}
				if joined {
					// The join phase answered every member's JoinGroup
					// and scheduled its session expiry afresh.
					m.seen, m.joining, m.syncing = now, false, false
				}
				if settled {
					m.settled = true
				}
				if !expires(dg.State, m) || g.session <= 0 {
					continue
				}
				if silent := now.Sub(m.seen); silent > g.session {
					drop = append(drop, expired{dg.Group, dm.MemberID, silent})
				}
			}
			for id := range g.members {
				if !listed[id] {
					delete(g.members, id)
				}
			}
		}
	}
	k.mu.Unlock()
	for _, e := range drop {
		k.leave(ctx, e.group, e.member, e.silent)
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

// leave removes member from group, as kfake's session expiry does.
func (k *keeper) leave(ctx context.Context, group, member string, silent time.Duration) {
	k.mu.Lock()
	g := k.groups[group]
	m := g.members[member]
	gone := m != nil && time.Since(m.seen) > g.session // not revived by a request meanwhile
	if gone {
		delete(g.members, member)
	}
	k.mu.Unlock()
	if !gone {
		return
	}
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = group
	lm := kmsg.NewLeaveGroupRequestMember()
	lm.MemberID = member
	reason := "session timeout (chaos broker's session keeper)"
	lm.Reason = &reason
	req.Members = append(req.Members, lm)
	resp, err := req.RequestWith(ctx, k.cl)
	if err == nil && resp.ErrorCode != 0 {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err == nil && len(resp.Members) == 1 && resp.Members[0].ErrorCode != 0 {
		err = kerr.ErrorForCode(resp.Members[0].ErrorCode)
	}
	switch {
	case errors.Is(err, kerr.UnknownMemberID):
		// kfake's own session timer dropped it first.
	case err != nil:
		fmt.Fprintf(k.log, "broker: dropping member %s of group %s after its session timeout: %v\n", member, group, err)
	default:
		fmt.Fprintf(k.log, "broker: member %s of group %s sent nothing for %s since its last request or the completion of its join: dropped (session timeout)\n",
			member, group, silent.Round(time.Millisecond))
	}
}
