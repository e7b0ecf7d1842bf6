package sqs_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/sources/sqs"
)

// TestSlowRenewalOfOneLane: while the visibility renewal of one lane's
// message hangs on the network, the heartbeat goes on renewing another
// lane's message, and both settle afterwards.
func TestSlowRenewalOfOneLane(t *testing.T) {
	t.Parallel()
	c, w := newWire(t)
	queue := fauxqs.NewQueue(t, c, "slowbeat.fifo", nil)
	w.holdRenewals(func(body string) bool { return body == "slow" })
	defer w.release()
	src := newSource(t, c, queue, sqs.Config{Receivers: 1, WaitTime: time.Second, VisibilityTimeout: 4 * time.Second, HeartbeatInterval: time.Second})
	send(t, c, queue, []outgoing{
		{Body: "slow", Group: "a", DedupeID: "slow"},
		{Body: "fast", Group: "b", DedupeID: "fast"},
	})
	b1, b2 := fetch(t, src, 10), fetch(t, src, 10)
	if b1.Lane == b2.Lane {
		t.Fatalf("both messages on lane %s", b1.Lane)
	}

	renewed := make(chan struct{}, 100)
	fast := []byte(w.handle("fast"))
	w.watch(func(op string, req []byte, err error) {
		if op == "ChangeMessageVisibilityBatch" && err == nil && bytes.Contains(req, fast) {
			renewed <- struct{}{}
		}
	})
	// Three renewals of the fast lane's message, at least one interval
	// apart, while every renewal of the slow one hangs.
	for i := range 3 {
		select {
		case <-renewed:
		case <-time.After(15 * time.Second):
			t.Fatalf("the fast lane's message was renewed %d times while the slow lane's renewal hung; want 3 (stats %+v)", i, src.Stats())
		}
	}
	w.release()
	settle(t, src, b1, b1.Messages, nil)
	settle(t, src, b2, b2.Messages, nil)
	expectEmpty(t, c, queue)
}
