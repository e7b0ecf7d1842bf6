package sourcetest

import (
	"context"

	"github.com/effectively-once/effectively/consumer"
)

// testSettleTwice: a batch settled already is no longer the source's to
// settle: a second Settle returns nil and changes nothing (here, the
// retry the first one asked for still happens).
func testSettleTwice(e *env) {
	want := e.publishN(0, 2)
	b := e.fetch(1)
	m := b.Messages[0]
	src := e.source()
	if err := e.settle(src, b, nil, []consumer.Retry{{Message: m, Delay: retryDelay}}); err != nil {
		e.Errorf("Settle: %v", err)
	}
	if err := src.Settle(context.Background(), b, b.Messages, nil); err != nil {
		e.Errorf("settling a batch a second time: %v, want nil (it is no longer the source's to settle)", err)
	}
	e.expectBack([]string{tag(m)}, false)
	e.drain(10, want)
}

// testLostAck: when an acknowledgement does not reach the broker, Settle
// returns an error, the lane is free again, and the messages are delivered
// again with the same Refs.
func testLostAck(e *env) {
	if e.b.FailAcks == nil {
		e.Skip("the harness cannot make acknowledgements fail (Broker.FailAcks)")
	}
	want := e.publishN(0, 3)
	b := e.fetch(10)
	restore := e.b.FailAcks(e.T)
	err := e.settle(e.source(), b, b.Messages, nil)
	restore()
	if err == nil {
		e.Errorf("Settle returned nil although the broker never received its acknowledgements")
	}
	e.expectBack(tags(b.Messages), true)
	e.drain(10, want)
}
