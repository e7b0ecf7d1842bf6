package sourcetest

import (
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/pg"
)

// TagHeader is the header the suite gives every message it publishes, with
// a value unique in the test, by which it recognises the message when it is
// delivered. A Broker's Publish must send it (as a Kafka header, an SQS
// message attribute…) and the source must deliver it in Message.Headers.
const TagHeader = "sourcetest-tag"

// Message is a message the suite publishes.
type Message struct {
	// Value is the payload. It is nil only in the checks of nil values,
	// which run only when Features.NilValues is set.
	Value []byte
	// Headers hold TagHeader, first, and possibly others.
	Headers []consumer.Header
}

// Tag returns the value of m's TagHeader, which Publish may also use as a
// message's broker-side identity (an SQS FIFO MessageDeduplicationId, the
// test broker's Message.ID).
func (m Message) Tag() string {
	for _, h := range m.Headers {
		if h.Key == TagHeader {
			return string(h.Value)
		}
	}
	return ""
}

// Features describe what a source's broker cannot do, or does differently
// within what the contract allows.
type Features struct {
	// Unordered: the source's lanes are not streams a producer publishes
	// to (an SQS standard queue, whose lanes are its receivers). Messages
	// published to one lane may be delivered on any lane, in any order, and
	// the checks of lane order are skipped.
	Unordered bool
	// HoldsLaneOnRetry: while a retried message waits out its delay, the
	// source delivers no later message of its lane (an SQS FIFO group).
	// Without it, the suite expects the later messages to go on.
	HoldsLaneOnRetry bool
	// NoEmptyValues: the broker cannot carry an empty value (an SQS body
	// is at least one character). The suite then publishes none.
	NoEmptyValues bool
	// NilValues: the source tells a message without a value (a Kafka
	// tombstone) from one with an empty value, delivering nil for the
	// first and a non-nil empty slice for the second. Without it the
	// suite publishes no nil values and accepts either for an empty one.
	NilValues bool
	// BinaryValues: the broker carries any bytes as a value (Kafka, the
	// test broker), not only text (an SQS body is Unicode text without
	// most control characters). Without it the suite publishes text only.
	BinaryValues bool
	// AttemptsSurviveRestart: the broker counts deliveries itself (SQS's
	// ApproximateReceiveCount), so a message redelivered after a restart
	// carries on its Attempt. Without it the suite accepts a count that
	// starts again at 1 in a new Source value.
	AttemptsSurviveRestart bool
	// Duplicates: the broker may deliver a message twice on its own. The
	// suite then accepts repeated deliveries where it otherwise expects
	// exactly one.
	Duplicates bool
}

// Broker is one test's broker: a fresh topic, queue or in-memory broker,
// empty at first, and the way to make sources that read it.
type Broker struct {
	// Publish appends msgs, in order, to lane (0 ≤ lane < Harness.Lanes):
	// a partition, a FIFO message group. With Features.Unordered it may
	// ignore lane. It returns once the broker holds the messages. Required.
	Publish func(t *testing.T, lane int, msgs ...Message)
	// Open returns a new Source over the broker, as a new process would
	// make it. The suite closes every source it opened that has a Close
	// method (Close() error) at the end of the test, and one it restarts
	// before opening the next. Required.
	Open func(t *testing.T) consumer.Source
	// DB holds the state a consumer.TxSource writes in the batch
	// transaction (Kafka offsets), and the tables of a source that is a
	// dedupe.Migrator (the suite migrates them again, with the migrations
	// table in pg.DefaultSchema). Required when the source is either.
	DB pg.DB
	// LoseLanes makes src lose every lane it holds and then get them back,
	// as in a consumer group rebalance, and returns once the batches src
	// handed out before are stale. Optional: without it the checks of lost
	// lanes are skipped.
	LoseLanes func(t *testing.T, src consumer.Source)
	// FailAcks makes the broker's acknowledgements fail from now on (as if
	// the network to the broker dropped them) until restore is called.
	// Optional: without it the check that Settle reports a lost
	// acknowledgement is skipped (as it must be for a source that
	// acknowledges asynchronously).
	FailAcks func(t *testing.T) (restore func())
}

// Harness describes a source to the suite.
type Harness struct {
	// New returns a fresh, empty Broker for one test. Required.
	New func(t *testing.T) *Broker
	// Lanes is how many lanes Broker.Publish can address. Defaults to 1.
	// With two or more the suite checks that lanes are delivered apart.
	Lanes int
	// RedeliveryDelay is the longest the source may take to deliver an
	// abandoned message again, or a message whose acknowledgement was
	// lost (an SQS queue's visibility timeout). Defaults to 0: at once.
	RedeliveryDelay time.Duration
	// Features describe what the broker cannot do.
	Features Features
	// ExhaustedAfter is, for a consumer.ExhaustionSource whose
	// ParkExhausted is false, the number of deliveries after which the
	// broker moves a message aside (an SQS redrive policy's
	// maxReceiveCount). Defaults to 0: the check that it does is skipped.
	ExhaustedAfter int
}

// Run runs the conformance suite against the source h describes. Every
// subtest gets a fresh Broker from h.New, and they run in parallel.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("sourcetest: Harness.New is required")
	}
	if h.Lanes < 1 {
		h.Lanes = 1
	}
	tests := []struct {
		name string
		run  func(*env)
	}{
		{"FetchBlocksWhileEmpty", testFetchBlocks},
		{"DeliversEverythingOnce", testDeliversEverything},
		{"OneBatchPerLane", testOneBatchPerLane},
		{"Values", testValues},
		{"RetryRedelivered", testRetryRedelivered},
		{"DueRetryGoesFirst", testDueRetryFirst},
		{"AbandonedRedelivered", testAbandoned},
		{"RestartRedelivers", testRestart},
		{"LostLane", testLostLane},
		{"SettleTwice", testSettleTwice},
		{"LostAck", testLostAck},
		{"HorizonSource", testHorizon},
		{"ContentIDSource", testContentID},
		{"ExhaustionSource", testExhaustion},
		{"Migrator", testMigrator},
		{"TxSourceCommitted", testTxCommitted},
		{"TxSourceRolledBack", testTxRolledBack},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := h.New(t)
			if b == nil || b.Publish == nil || b.Open == nil {
				t.Fatal("sourcetest: Harness.New must return a Broker with Publish and Open")
			}
			tc.run(newEnv(t, h, b))
		})
	}
}
