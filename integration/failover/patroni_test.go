//go:build patroni

package failover

import (
	"context"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/standby"
	"github.com/effectively-once/effectively/pgtest"
)

// The failover invariant under a real HA manager (make test-patroni): a
// pair of servers managed by Patroni with etcd (pgtest.StartPatroni), the
// consumer on the multi-host URL with target_session_attrs=read-write, and
// the leader's postgres killed with SIGKILL mid-run. The test does not
// promote anything: Patroni notices the crash, hands the leader key over,
// promotes the standby and makes the old primary (rewound with pg_rewind)
// a standby of the new one, and the test waits for each of those events.
// Each source runs with synchronous and asynchronous replication
// (Patroni's synchronous_mode on and off) and with StandbyAck off and on,
// through the same runs as the tests that promote the standby themselves.

// patroniServers is a Patroni-managed pair as the failover tests see it:
// the leader and the standby of the test's start.
type patroniServers struct {
	t                *testing.T
	p                *pgtest.Patroni
	leader, follower *pgtest.PatroniMember
}

func (s patroniServers) createDatabase(ctx context.Context, name string) (string, error) {
	return s.p.CreateDatabase(ctx, name)
}
func (s patroniServers) url(name string) string            { return s.p.URL(name) }
func (s patroniServers) primary() string                   { return s.leader.URL() }
func (s patroniServers) standby() string                   { return s.follower.URL() }
func (s patroniServers) killPrimary() error                { return s.p.Kill(s.leader) }
func (s patroniServers) promote(ctx context.Context) error { return s.p.WaitLeader(ctx, s.follower) }
func (s patroniServers) catchUp(ctx context.Context) error {
	return s.p.CatchUp(ctx, s.leader, s.follower)
}
func (s patroniServers) stopStreaming(ctx context.Context) error { return s.p.CutOff(ctx, s.leader) }

// newStandby waits until Patroni has made the old leader a standby of the
// promoted one; Patroni stops it with the pair.
func (s patroniServers) newStandby(ctx context.Context) (func() error, error) {
	begin := time.Now()
	if err := s.p.WaitStreaming(ctx, s.follower, s.leader); err != nil {
		return nil, err
	}
	s.t.Logf("%s streams from %s again, %v after the test asked", s.leader.Name, s.follower.Name, time.Since(begin).Round(time.Millisecond))
	return func() error { return nil }, nil
}

// startPatroniPair starts a Patroni-managed pair with synchronous_mode on
// or off and the test database on it. It skips the test when Patroni or
// etcd is not installed, unless CI is set.
func startPatroniPair(t *testing.T, synchronous bool) *pair {
	t.Helper()
	p := pgtest.NewPatroni(t, pgtest.PatroniOptions{Synchronous: synchronous})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	leader, err := p.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return newPair(t, patroniServers{t: t, p: p, leader: leader, follower: p.Other(leader)})
}

// patroniRuns are the sources and the StandbyAck settings each replication
// mode runs with.
var patroniRuns = []struct {
	name string
	ack  standby.Config
}{
	{"StandbyAck-off", standby.Config{}},
	{"StandbyAck-on", standbyAck},
}

// Synchronous replication under Patroni (synchronous_mode): every COMMIT
// the consumer saw succeed is on the promoted standby, and every message
// ends with exactly one effect, with either source and StandbyAck off or
// on (on, the batches committed after the switch wait until Patroni has
// made the old primary a standby again).
func TestPatroniSynchronousFailover(t *testing.T) {
	for _, run := range patroniRuns {
		t.Run("Kafka/"+run.name, func(t *testing.T) {
			kafkaSynchronous(t, startPatroniPair(t, true), kafkaGo, run.ack)
		})
		t.Run("SQS/"+run.name, func(t *testing.T) {
			sqsSynchronous(t, startPatroniPair(t, true), run.ack)
		})
	}
}

// Asynchronous replication under Patroni: the standby is cut off (the
// primary's pg_hba.conf refuses it), the consumer commits at least a
// batch's worth on the primary alone, the primary's postgres is killed and
// Patroni promotes the standby, which lacks those commits. Without
// StandbyAck, SQS loses the messages it had acknowledged after the cut
// and Kafka's running consumer finds the offsets table behind it and
// consumes the range again; with it, nothing the standby lacked was
// acknowledged, and nothing is lost or fenced. (Patroni fails over to a
// standby lagging by less than maximum_lag_on_failover, 1 MB by default.)
func TestPatroniAsynchronousFailover(t *testing.T) {
	for _, on := range []bool{false, true} {
		name := map[bool]string{false: "StandbyAck-off", true: "StandbyAck-on"}[on]
		t.Run("Kafka/"+name, func(t *testing.T) {
			kafkaAsynchronousStandbyAck(t, startPatroniPair(t, false), on)
		})
		t.Run("SQS/"+name, func(t *testing.T) {
			sqsAsynchronousStandbyAck(t, startPatroniPair(t, false), on)
		})
	}
}
