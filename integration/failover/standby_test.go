package failover

import (
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer/standby"
)

// Asynchronous failovers with consumer.Config.StandbyAck: a batch is
// acknowledged only once the standby holds its commit. Each test runs the
// same scenario with the setting off and on: the standby is cut off, the
// consumer commits at least a batch's worth of messages on the primary
// alone, the primary is killed and the standby promoted (and given a
// standby of its own, as an HA manager does). Off, what docs/failover.md
// says is lost is lost; on, nothing is.

// standbyAck is the setting the tests turn on: one standby, and a bound
// far beyond the test's cut-off, so that no batch is acknowledged
// unconfirmed while the standby is cut off.
var standbyAck = standby.Config{Standbys: 1, Timeout: time.Minute}

// SQS deletes a message once acknowledged. Off: the messages of the
// commits the promoted standby lacks were deleted and are never applied.
// On: none of those commits was acknowledged; the batches waiting for the
// standby are handed back when the primary changes, delivered again and
// applied on the promoted standby: every message exactly once.
func TestSQSAsynchronousFailoverStandbyAck(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(map[bool]string{false: "off", true: "on"}[on], func(t *testing.T) {
			sqsAsynchronousStandbyAck(t, startPair(t, false), on)
		})
	}
}

// sqsAsynchronousStandbyAck is TestSQSAsynchronousFailoverStandbyAck's
// run on the asynchronous pair p, with StandbyAck on or off.
func sqsAsynchronousStandbyAck(t *testing.T, p *pair, on bool) {
	s := newSQSRun(t, p)
	if on {
		s.ack = standbyAck
	}
	r := s.start()

	s.h.waitApplied(t, messages/4)
	cut, before := p.cutOffUnacknowledged(s.h, s.g)
	ackedAlone, _, _ := s.h.counts()
	ackedAlone -= cut
	promoted := p.killAndPromote(s.g)
	p.newStandby()
	s.waitDrained()
	r.Stop(t)
	final := p.effects(p.s.standby())

	lost := 0 // committed on the primary, never applied again
	for id := range before {
		if final[id] == 0 {
			lost++
		}
	}
	_, unknown, errs := s.h.counts()
	t.Logf("StandbyAck %v, N=%d (%d sent): %d effects on the primary at the kill, %d acknowledged after the cut, %d on the standby once promoted (cut off after %d applied), %d at the end: %d never applied; %d batches rolled back or handed back (%d by StandbyAck), %d acknowledged unconfirmed, %d messages with an unknown outcome",
		on, messages, messages+messages/10, rows(before), ackedAlone, rows(promoted), cut, rows(final), lost, errs, s.h.handedBack, s.h.unconfirmed, unknown)
	expectLoss(t, promoted, before)
	if d := twice(final); len(d) != 0 {
		t.Errorf("applied twice: %v", d)
	}
	if !on {
		if lost == 0 || ackedAlone == 0 {
			t.Errorf("%d messages acknowledged on the primary alone, %d lost: want a loss without StandbyAck", ackedAlone, lost)
		}
		return
	}
	if ackedAlone != 0 {
		t.Errorf("%d messages acknowledged while the standby was cut off, want none", ackedAlone)
	}
	if s.h.unconfirmed != 0 || s.h.handedBack == 0 {
		t.Errorf("%d batches acknowledged unconfirmed (want 0), %d handed back (want some)", s.h.unconfirmed, s.h.handedBack)
	}
	expectEach(t, final)
}

// The Kafka source keeps its offsets in Postgres. Off: the running
// consumer finds the promoted standby's table behind it, at its next
// offset write (it drops the batch, fenced) or at its once-a-second
// comparison of the stored positions with its lanes' (whichever comes
// first), and rejoins to consume again from there.
// On: the source never learns of an offset the standby lacks, so its
// offsets never have to go back: no batch is fenced, and every message
// ends with exactly one effect either way.
func TestKafkaAsynchronousFailoverStandbyAck(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(map[bool]string{false: "off", true: "on"}[on], func(t *testing.T) {
			kafkaAsynchronousStandbyAck(t, startPair(t, false), on)
		})
	}
}

// kafkaAsynchronousStandbyAck is TestKafkaAsynchronousFailoverStandbyAck's
// run on the asynchronous pair p, with StandbyAck on or off.
func kafkaAsynchronousStandbyAck(t *testing.T, p *pair, on bool) {
	k := newKafkaRun(t, p, kafkaGo)
	if on {
		k.ack = standbyAck
	}
	_, r := k.start()

	k.h.waitApplied(t, messages/4)
	k.waitStored()
	cut, before := p.cutOffUnacknowledged(k.h, k.g)
	ackedAlone, _, _ := k.h.counts()
	ackedAlone -= cut
	promoted := p.killAndPromote(k.g)
	p.newStandby()
	k.waitAll()
	r.Stop(t)
	final := p.effects(p.s.standby())
	k.h.mu.Lock()
	fenced, handedBack, unconfirmed := k.h.fenced, k.h.handedBack, k.h.unconfirmed
	k.h.mu.Unlock()
	wentBack := k.wentBack.Load()
	t.Logf("StandbyAck %v, N=%d (%d records): %d effects on the primary at the kill, %d acknowledged after the cut, %d on the standby once promoted (cut off after %d applied), %d at the end; %d batches fenced because the offsets went back, the source found the offsets table behind %d times, %d batches handed back by StandbyAck, %d acknowledged unconfirmed",
		on, messages, messages+messages/10, rows(before), ackedAlone, rows(promoted), cut, rows(final), fenced, wentBack, handedBack, unconfirmed)
	expectLoss(t, promoted, before)
	expectEach(t, final)
	if !on {
		if fenced == 0 && wentBack == 0 {
			t.Errorf("no batch fenced and the source never found the offsets table behind: want it found behind the consumer without StandbyAck")
		}
		return
	}
	if ackedAlone != 0 || fenced != 0 || wentBack != 0 || unconfirmed != 0 {
		t.Errorf("%d messages acknowledged while the standby was cut off, %d batches fenced, the offsets table found behind %d times, %d acknowledged unconfirmed: want none", ackedAlone, fenced, wentBack, unconfirmed)
	}
}
