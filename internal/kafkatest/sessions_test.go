package kafkatest

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestDeadJoinersAreDropped: members whose process died while their
// JoinGroup waited in the coordinator are counted as joined and assigned
// partitions; Kafka drops them SessionTimeout after the join phase
// completed. kfake alone keeps those whose JoinGroup response it could not
// hand to their closed connection (about half of them: the response goes
// to a buffered channel or not) until another member joins and that
// rebalance's RebalanceTimeout drops them, which this test's
// RebalanceTimeout puts out of reach. With eight dead joiners, kfake alone
// keeps at least one nearly always.
func TestDeadJoinersAreDropped(t *testing.T) {
	const (
		group     = "g"
		topic     = "t"
		session   = 3 * time.Second
		rebalance = 20 * time.Second
		dead      = 8
	)
	c := New(t, kfake.SeedTopics(4, topic), kfake.GroupMinSessionTimeout(time.Second))
	if c.Fake() == nil {
		t.Skip("KAFKA_BROKERS names a real cluster, which expires sessions itself")
	}
	c.LogSessions(os.Stderr)
	addrs := c.Brokers()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)

	// The live member: a kafka-go consumer group, as the chaos workers.
	cg, err := kafkago.NewConsumerGroup(kafkago.ConsumerGroupConfig{
		ID: group, Brokers: addrs, Topics: []string{topic},
		SessionTimeout: session, RebalanceTimeout: rebalance, HeartbeatInterval: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cg.Close() })
	go func() {
		for {
			gen, err := cg.Next(ctx)
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, kafkago.ErrGroupClosed) {
					return
				}
				continue
			}
			gen.Start(func(ctx context.Context) { <-ctx.Done() })
		}
	}()
	admin, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	members := func() (state string, ids []string) {
		req := kmsg.NewPtrDescribeGroupsRequest()
		req.Groups = []string{group}
		resp, err := req.RequestWith(ctx, admin)
		if err != nil || len(resp.Groups) != 1 {
			return "", nil
		}
		for _, m := range resp.Groups[0].Members {
			ids = append(ids, m.MemberID)
		}
		return resp.Groups[0].State, ids
	}
	waitFor := func(what string, limit time.Duration, cond func(state string, ids []string) bool) (string, []string) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for {
			state, ids := members()
			if cond(state, ids) {
				return state, ids
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not after %s; the group is %s with members %v", what, limit, state, ids)
			}
			time.Sleep(20 * time.Millisecond) // polling the coordinator's state
		}
	}
	_, live := waitFor("the live member's generation", 30*time.Second, func(state string, ids []string) bool {
		return state == "Stable" && len(ids) == 1
	})

	// The dead joiners: each joins on a connection of its own, all in one
	// rebalance, and is gone while its JoinGroup waits for the live member
	// to rejoin.
	var (
		deadIDs []string
		joins   []*kmsg.JoinGroupRequest
		clients []*kgo.Client
	)
	for i := range dead {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		join := kmsg.NewPtrJoinGroupRequest()
		join.Group = group
		join.SessionTimeoutMillis = int32(session.Milliseconds())
		join.RebalanceTimeoutMillis = int32(rebalance.Milliseconds())
		join.ProtocolType = "consumer"
		meta := kmsg.NewConsumerMemberMetadata()
		meta.Topics = []string{topic}
		proto := kmsg.NewJoinGroupRequestProtocol()
		proto.Name = "range"
		proto.Metadata = meta.AppendTo(nil)
		join.Protocols = append(join.Protocols, proto)
		resp, err := join.RequestWith(ctx, cl) // v4 and later: the coordinator hands out a member ID first
		if err != nil {
			t.Fatal(err)
		}
		if resp.ErrorCode != kerr.MemberIDRequired.Code {
			t.Fatalf("dead joiner %d: first JoinGroup answered %v, want MemberIDRequired", i, kerr.ErrorForCode(resp.ErrorCode))
		}
		join.MemberID = resp.MemberID
		deadIDs = append(deadIDs, resp.MemberID)
		joins = append(joins, join)
		clients = append(clients, cl)
	}
	jctx, jcancel := context.WithCancel(ctx)
	for i, join := range joins {
		go func() { _, _ = join.RequestWith(jctx, clients[i]) }()
	}
	waitFor("the dead joiners in the join", 30*time.Second, func(_ string, ids []string) bool {
		for _, id := range deadIDs {
			if !slices.Contains(ids, id) {
				return false
			}
		}
		return true
	})
	jcancel()
	for _, cl := range clients {
		cl.Close()
	}

	// The live member rejoins, the join phase completes with the dead
	// joiners counted in, and then they must go within a session timeout
	// (plus the live member's rejoin, which their leaving causes).
	waitFor("the join phase to complete", 30*time.Second, func(state string, ids []string) bool {
		return state == "Stable" || state == "CompletingRebalance"
	})
	completed := time.Now()
	state, ids := waitFor("the dead joiners to be dropped", session+5*time.Second, func(state string, ids []string) bool {
		for _, id := range deadIDs {
			if slices.Contains(ids, id) {
				return false
			}
		}
		return state == "Stable" && len(ids) == 1
	})
	t.Logf("%d dead joiners dropped %s after the join phase completed; the group is %s with %v (the live member was %v)",
		dead, time.Since(completed).Round(time.Millisecond), state, ids, live)
}
