package failover

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/jackc/pgx/v5"
)

// The invariant workload through a failover, with the test broker: a source
// that, like SQS, forgets a message once it is acknowledged and redelivers
// what was not.

// insertEffect is the handler: one effect row per message, after the gate.
func insertEffect(g *gate) consumer.Handler {
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		g.pass(ctx)
		_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id) VALUES ($1)`, m.ID)
		return err
	}
}

// startBrokerConsumer publishes the workload on a broker that also
// redelivers some messages, and runs a consumer on it through the pair's
// multi-host pool.
func startBrokerConsumer(t *testing.T, p *pair, h *progress, g *gate) (*consumertest.Broker, *consumertest.Running) {
	t.Helper()
	b := consumertest.New(consumertest.Config{Lanes: 4, DuplicateRate: 0.1})
	for i := range messages {
		m := consumer.Message{ID: fmt.Sprintf("m-%d", i), Value: []byte("v")}
		b.Publish(i, m)
		if i%10 == 0 {
			b.Publish(i, m) // a producer's duplicate
		}
	}
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := consumertest.NewConsumer(t, p.pool, b, consumer.Config{
		Name:            "failover",
		Strategy:        strategy,
		Handler:         insertEffect(g),
		BatchSize:       batchSize,
		RetryBackoff:    20 * time.Millisecond,
		MaxRetryBackoff: 100 * time.Millisecond,
		Hooks:           []consumer.Hook{h},
		Logger:          logger(t),
	})
	return b, consumertest.Start(c)
}

// finish waits until the broker has nothing left to deliver and stops the
// consumer.
func finish(t *testing.T, b *consumertest.Broker, r *consumertest.Running) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	werr := b.WaitIdle(ctx)
	r.Stop(t)
	if werr != nil {
		t.Fatal(werr)
	}
}

// Synchronous replication: the primary is killed mid-run, the standby is
// promoted, and the consumer goes on through the same multi-host pool.
// Every COMMIT the consumer saw succeed is on the standby, and a batch cut
// off by the kill (in its handlers, or in its COMMIT) is delivered again: a
// duplicate if its COMMIT had reached the standby. So each message has
// exactly one effect. The primary is killed either with the handlers held
// (batches in their transactions, the count of effects known at the kill)
// or as soon as a third of the messages are applied, with batches
// committing.
func TestSynchronousFailover(t *testing.T) {
	for _, held := range []bool{true, false} {
		name := map[bool]string{true: "held", false: "running"}[held]
		t.Run(name, func(t *testing.T) { synchronousFailover(t, held) })
	}
}

func synchronousFailover(t *testing.T, held bool) {
	p := startPair(t, true)
	h, g := newProgress(), newGate()
	b, r := startBrokerConsumer(t, p, h, g)

	h.waitApplied(t, messages/3)
	before := map[string]int{}
	if held {
		g.hold(t)
		before = p.effects(p.s.primary())
	}
	appliedAtKill, _, _ := h.counts()
	promoted := p.killAndPromote(g)
	finish(t, b, r)
	final := p.effects(p.s.standby())

	_, unknown, errs := h.counts()
	atKill := "not counted"
	if held {
		atKill = fmt.Sprint(rows(before))
	}
	t.Logf("N=%d: effects on the primary at the kill: %s (%d reported applied), %d on the standby once promoted, %d at the end; %d batches rolled back by the switch, %d messages with an unknown COMMIT outcome; broker %+v",
		messages, atKill, appliedAtKill, rows(promoted), rows(final), errs, unknown, b.Stats())
	expectKept(t, promoted, appliedAtKill)
	for id := range before {
		if promoted[id] == 0 {
			t.Errorf("%s was committed on the primary and is missing on the promoted standby", id)
			break
		}
	}
	expectEach(t, final)
	if parked := consumertest.Parked(t, p.pool, "", ""); len(parked) != 0 {
		t.Errorf("%d messages parked, want none", len(parked))
	}
}

// Asynchronous replication and a source that forgets what it acknowledged
// (SQS deletes a message once acknowledged): the standby is cut off, the
// consumer commits and acknowledges more batches on the primary alone, and
// the primary dies. Those commits are lost with it, and so are their
// messages: they were deleted from the source. No message is applied
// twice, but the lost ones are never applied again. This is the loss
// window docs/postgres-settings.md describes, and why SQS needs
// synchronous replication.
func TestAsynchronousFailoverLosesAcknowledged(t *testing.T) {
	p := startPair(t, false)
	h, g := newProgress(), newGate()
	b, r := startBrokerConsumer(t, p, h, g)

	h.waitApplied(t, messages/4)
	cut, before := p.cutOff(h, g)
	promoted := p.killAndPromote(g)
	finish(t, b, r)
	final := p.effects(p.s.standby())

	var lost []string // committed on the primary, acknowledged, never applied again
	for id := range before {
		if final[id] == 0 {
			lost = append(lost, id)
		}
	}
	slices.Sort(lost)
	_, unknown, errs := h.counts()
	t.Logf("N=%d: %d effects on the primary shortly before the kill, %d on the standby once promoted (cut off after %d applied), %d at the end: %d messages never applied, %d of them seen on the primary before the kill; %d batches rolled back by the switch, %d messages with an unknown COMMIT outcome",
		messages, rows(before), rows(promoted), cut, rows(final), messages-len(final), len(lost), errs, unknown)
	expectLoss(t, promoted, before)
	if len(lost) == 0 {
		t.Errorf("no message committed only on the primary is missing at the end")
	}
	if got := len(final); got+len(lost) > messages || got >= messages {
		t.Errorf("%d distinct messages applied and %d lost, of %d", got, len(lost), messages)
	}
	if d := twice(final); len(d) != 0 {
		t.Errorf("applied twice: %v", d)
	}
	if rows(promoted) < cut {
		t.Errorf("the promoted standby has %d effects, fewer than the %d it had caught up with before it was cut off", rows(promoted), cut)
	}
}
