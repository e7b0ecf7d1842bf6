// Package sourcetest is the conformance suite every consumer.Source passes:
// it checks the contract documented on consumer.Source against a real
// broker, acting as the consumer (Fetch, the batch transaction for a
// consumer.TxSource, Settle).
//
// A source's tests describe their broker with a Harness and call Run:
//
//	func TestSourceConformance(t *testing.T) {
//		sourcetest.Run(t, sourcetest.Harness{
//			Lanes: 3,
//			New: func(t *testing.T) *sourcetest.Broker {
//				topic := newTopic(t, 3)
//				return &sourcetest.Broker{
//					Publish: func(t *testing.T, lane int, msgs ...sourcetest.Message) { produce(t, topic, lane, msgs) },
//					Open:    func(t *testing.T) consumer.Source { return newSource(t, topic) },
//				}
//			},
//			Features: sourcetest.Features{BinaryValues: true},
//		})
//	}
//
// Run checks that Fetch blocks while there is nothing to deliver and
// returns when its context is done, never with an empty batch; that every
// published message is delivered, intact, once, in batches of at most the
// size asked for, of one lane each, never two batches of a lane at a time,
// each lane in order; that acknowledged messages are not delivered again;
// that retried and abandoned messages come back with the same Ref and the
// next Attempt, due ones before the lane's undelivered messages; that a
// restart delivers again what was not acknowledged; that Settle returns nil
// for a batch whose lane was lost or that was settled already, and an error
// when an acknowledgement did not reach the broker; and that values keep
// their bytes (and nil stays distinct from empty where the source can tell
// them apart).
//
// Features turn off or adjust the checks a broker cannot pass, and the
// optional Broker hooks (LoseLanes, FailAcks) enable the checks that need
// them; a skipped check says why.
package sourcetest
