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
// It also checks each optional interface of a source (package consumer's
// documentation lists them) that the source implements, found by type
// assertion as consumer.New finds it, and skips the check with the reason
// when it does not: a HorizonSource answers promptly with a cancelled
// context (an error, or what it knows already) and, once set up, a positive
// horizon, the same at every call; a ContentIDSource's window is never
// negative and does not change; an ExhaustionSource's ParkExhausted does
// not change, and when it is false no message is delivered after the
// broker's limit (Harness.ExhaustedAfter); a source that is a
// dedupe.Migrator has lines that pg.Migrate applies, after which a
// second Migrate applies nothing; and a TxSource's BeforeCommit writes
// with its transaction: what it acknowledged in a transaction that
// committed is not delivered again after a restart or a lost lane, even
// unsettled, and what it was to acknowledge in one that rolled back comes
// back.
//
// Features turn off or adjust the checks a broker cannot pass, and the
// optional Broker hooks (LoseLanes, FailAcks) enable the checks that need
// them; a skipped check says why.
package sourcetest
