package kafka

import (
	"errors"
	"fmt"
	"testing"

	kafkago "github.com/segmentio/kafka-go"
)

// The coordinator's "rejoin" answers during a rebalance are part of group
// membership, not failures: Fetch must not report them (a worker of a
// group that rebalances would log fetch errors, and count them towards
// consumer.Config.SourceFailureTimeout, at every rebalance). Errors that
// mean the group cannot be reached at all are still reported.
func TestRebalancingIsNotAGroupFailure(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{kafkago.RebalanceInProgress, true},
		{fmt.Errorf("sync group: %w", kafkago.RebalanceInProgress), true},
		{kafkago.UnknownMemberId, true},
		{kafkago.IllegalGeneration, true},
		{kafkago.MemberIDRequired, true},
		{kafkago.GroupAuthorizationFailed, false},
		{kafkago.SASLAuthenticationFailed, false},
		{errors.New("failed to dial: connection refused"), false},
	} {
		if got := rebalancing(tc.err); got != tc.want {
			t.Errorf("rebalancing(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
