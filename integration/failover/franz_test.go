package failover

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/sources/franz"
)

// franzGo makes the sources/franz source of a run, with the quick group
// timings of the tests.
func franzGo(cfg KafkaConfig) (KafkaSource, error) {
	return franz.New(cfg.Pool, franz.Config{
		Brokers: cfg.Brokers,
		Group:   cfg.Group,
		Topics:  []string{cfg.Topic},
		Opts: []kgo.Opt{
			kgo.SessionTimeout(kafkatest.SessionTimeout),
			kgo.HeartbeatInterval(kafkatest.HeartbeatInterval),
			kgo.RebalanceTimeout(5 * time.Second),
			kgo.FetchMaxWait(kafkatest.MaxWait),
		},
		RevokeTimeout: 2 * time.Second,
		Logger:        cfg.Logger,
	})
}

// TestFranz runs sources/franz through the failovers of RunKafka, as
// TestKafka runs sources/kafka: every message ends with exactly one effect.
func TestFranz(t *testing.T) { RunKafka(t, franzGo) }
