package chaostest

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// plan is what one chaos run does.
type plan struct {
	messages   int     // logical messages
	backlog    int     // of them, produced before the first worker starts
	workers    int     // workers alive at any time (a killed one is replaced)
	kills      int     // SIGKILLs of a random worker
	freezes    int     // SIGSTOPs of a random worker for longer than stallBound
	topology   bool    // create a topic the workers consume, add partitions to another
	dupRate    float64 // share of logical messages the producer sends twice
	poisonRate float64 // share of logical messages the handler rejects permanently
	seed       int64
	deadline   time.Duration // for the whole run; waits are progress-based within it
}

// groupTiming is the consumer group configuration of every worker:
// explicit and short, so that a run takes a minute or two.
type groupTiming struct {
	session, heartbeat, rebalance time.Duration
}

var timing = groupTiming{
	session:   6 * time.Second, // the smallest a Kafka broker accepts by default
	heartbeat: 500 * time.Millisecond,
	rebalance: 10 * time.Second,
}

// stallBound is the longest a partition may have messages waiting without
// its position moving, after a worker is killed or frozen (or resumes),
// for a group configured with t. The Kafka source documents it as a
// function of its Config; keep the two in step:
//
//   - a dead or frozen member is noticed when its session expires,
//     SessionTimeout after its last heartbeat;
//   - the rebalance that follows waits at most RebalanceTimeout for the
//     live members to rejoin (they notice within a HeartbeatInterval);
//   - the partition's new owner then claims it in Postgres, seeks and
//     commits its first batch.
//
// A kill that lands during a rebalance, while the victim's JoinGroup waits
// in the coordinator, takes the same terms in the other order: the join
// phase completes counting the dead member in (at most RebalanceTimeout
// after the rebalance began, which revoked the partitions it is then
// assigned), the coordinator schedules its session expiry at that
// completion, and SessionTimeout later the rebalance that drops it runs
// with live members only (a heartbeat to notice, their in-flight batches,
// the claim). So SessionTimeout + RebalanceTimeout + heartbeats bounds it
// too. That is Kafka's rule; kfake on its own never expired such a
// member (see package internal/kafkatest, whose session keeper the
// runs' broker has), and the partitions stalled until the next kill.
//
// The slack covers that last step and the sampler's resolution on machines
// 2-3x slower than an idle development machine. A frozen member must not
// lengthen any of this: its session expires like a dead one's, and its open
// transaction must not hold up the new owner.
//
// Each membership change starts that recovery afresh: a kill while the
// group still recovers from the last one (a kill storm, see Storm) is a
// kill during a rebalance, bounded as above from the later kill. So the
// bound holds from the last kill or freeze before the stall ended (see
// stallExcess), not from the first; a thaw restarts nothing.
//
// Static members (a worker's replacement joins with its instance ID) make
// a kill cost less, not more: the replacement takes the dead member's
// place as soon as it joins, in a rebalance the live members join within
// a heartbeat, without the session timeout; the bound above stays an
// upper bound and is not tightened, since a replacement may take longer
// to start than the session takes to expire on a loaded machine.
func stallBound(t groupTiming) time.Duration {
	const slack = 6 * time.Second
	return t.session + t.rebalance + 4*t.heartbeat + slack
}

// topologyBound is the longest after a topic the workers are configured
// to consume is created, or partitions are added to one, until the new
// partitions' first records are consumed: the group notices the change
// (kafka-go's partition watch polls every 5s by default, and the Kafka
// source may choose its own interval), rebalances, and the new owners claim.
func topologyBound(t groupTiming) time.Duration {
	const watch = 10 * time.Second
	return watch + stallBound(t)
}

// freezeFor is how long a frozen worker stays stopped: longer than
// stallBound, so that a group that waits for it to resume cannot pass.
func freezeFor(t groupTiming) time.Duration { return stallBound(t) + 2*time.Second }

func planFromEnv(t *testing.T) plan {
	p := plan{
		messages: 20_000, backlog: 5_000, workers: 3, kills: 3, freezes: 1, topology: true,
		dupRate: 0.05, poisonRate: 0.002, seed: time.Now().UnixNano() % 1_000_000, deadline: 6 * time.Minute,
	}
	if os.Getenv("CHAOS_FULL") == "1" {
		p.messages, p.backlog, p.kills, p.freezes, p.workers, p.deadline = 120_000, 25_000, 12, 2, 4, 20*time.Minute
	}
	atoi := func(name string, dst *int) {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				t.Fatalf("%s=%q: want a number", name, v)
			}
			*dst = n
		}
	}
	atoi("CHAOS_MESSAGES", &p.messages)
	atoi("CHAOS_KILLS", &p.kills)
	atoi("CHAOS_FREEZES", &p.freezes)
	atoi("CHAOS_WORKERS", &p.workers)
	if v := os.Getenv("CHAOS_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED=%q: want a number", v)
		}
		p.seed = n
	}
	if os.Getenv("CHAOS_TOPOLOGY") == "0" {
		p.topology = false
	}
	p.backlog = min(p.backlog, p.messages/4)
	p.workers = max(p.workers, 2)
	return p
}
