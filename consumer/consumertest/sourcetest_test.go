package consumertest_test

import (
	"testing"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/sourcetest"
)

// TestSourceConformance runs the source conformance suite against the test
// broker: a restart and a lost lane are both a Crash, after which the same
// broker is the new source.
func TestSourceConformance(t *testing.T) {
	const lanes = 3
	sourcetest.Run(t, sourcetest.Harness{
		Lanes: lanes,
		New: func(t *testing.T) *sourcetest.Broker {
			b := consumertest.New(consumertest.Config{Lanes: lanes})
			opened := false
			return &sourcetest.Broker{
				Publish: func(_ *testing.T, lane int, msgs ...sourcetest.Message) {
					for _, m := range msgs {
						b.Publish(lane, consumer.Message{ID: m.Tag(), Value: m.Value, Headers: m.Headers})
					}
				},
				Open: func(*testing.T) consumer.Source {
					if opened {
						b.Crash()
					}
					opened = true
					return b
				},
				LoseLanes: func(*testing.T, consumer.Source) { b.Crash() },
			}
		},
		Features: sourcetest.Features{NilValues: true, BinaryValues: true, AttemptsSurviveRestart: true},
	})
}
