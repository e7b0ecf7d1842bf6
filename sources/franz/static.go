package franz

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Static membership (Config.InstanceID, KIP-345): a restarted process with
// the member's instance ID takes its place without a rebalance of the
// group, the member it replaces is fenced, and a clean Close leaves the
// group all the same.

// ErrFencedInstance is matched by the permanent error Fetch returns once
// the group coordinator fenced this static member: another process joined
// with the same Config.InstanceID and took its place. It is
// kerr.FencedInstanceID, so either matches.
var ErrFencedInstance = kerr.FencedInstanceID

// leaveTimeout bounds a static member's leave at Close.
const leaveTimeout = 10 * time.Second

// instanceFenced reports whether err, from a poll, says that the
// coordinator fenced this static member. The first time, it makes the
// source stop: Fetch returns a permanent error from now on, and the
// client's group management ends, so that kgo does not rejoin with the
// instance ID and fence the replacement in turn. The lanes were dropped
// already: kgo called OnPartitionsLost first.
func (s *Source) instanceFenced(cl *kgo.Client, err error) bool {
	if !errors.Is(err, kerr.FencedInstanceID) {
		return false
	}
	perm := consumer.Permanent(fmt.Errorf("franz: consumer group %q: another process joined with this member's instance ID %q and took its place; "+
		"this source stops consuming (give every process of the group its own Config.InstanceID): %w", s.cfg.Group, s.instanceID, err))
	if !s.fencedInstance.CompareAndSwap(nil, &perm) {
		return true
	}
	s.log.Error("franz: fenced as a static member: another process joined with the same instance ID; stopping, its partitions are the other's",
		"group", s.cfg.Group, "instance_id", s.instanceID, "err", err)
	// Leaving ends kgo's group management; it sends no LeaveGroup for a
	// static member (except after a cooperative revoke that owes a
	// rejoin, and that leave names the fenced member ID, which Kafka's
	// coordinator refuses). Not waited for here: the poll loop goes on.
	go func() { _ = cl.LeaveGroupContext(s.runCtx) }()
	return true
}

// leaveStatic leaves the group as a static member at Close: kgo's own leave
// (its revoke callbacks; a static member sends no LeaveGroup there, so
// that a restart finds its place kept), then a LeaveGroup naming the
// member and its instance ID (version 3 and up), so that the coordinator
// rebalances at once and the others take the partitions over. A fenced
// member does not leave: its instance ID is the replacement's now.
func (s *Source) leaveStatic(cl *kgo.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), leaveTimeout)
	defer cancel()
	if err := cl.LeaveGroupContext(ctx); err != nil {
		s.log.Warn("franz: leaving the group", "group", s.cfg.Group, "instance_id", s.instanceID, "err", err)
	}
	if s.fencedInstance.Load() != nil {
		return
	}
	memberID, _ := cl.GroupMetadata()
	if memberID == "" {
		return // never joined
	}
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = s.cfg.Group
	m := kmsg.NewLeaveGroupRequestMember()
	m.MemberID = memberID
	m.InstanceID = &s.instanceID
	m.Reason = kmsg.StringPtr("closed: handing the partitions over at once")
	req.Members = append(req.Members, m)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
		for _, mr := range resp.Members {
			if err == nil {
				err = kerr.ErrorForCode(mr.ErrorCode)
			}
		}
	}
	switch {
	case errors.Is(err, kerr.UnknownMemberID):
		// kgo's leave sent one already (after a cooperative revoke), or
		// the session had expired: the member is gone either way.
	case err != nil:
		s.log.Warn("franz: leaving the group as a static member failed; the others take its partitions after the session timeout",
			"group", s.cfg.Group, "instance_id", s.instanceID, "err", err)
	default:
		s.log.Info("franz: left the group", "group", s.cfg.Group, "instance_id", s.instanceID)
	}
}
