package failover

import (
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/sources/kafka"
)

// kafkaGo makes the sources/kafka source of a run.
func kafkaGo(cfg KafkaConfig) (KafkaSource, error) {
	return kafka.New(cfg.Pool, kafka.Config{
		Brokers:           cfg.Brokers,
		Group:             cfg.Group,
		Topics:            []string{cfg.Topic},
		MaxWait:           kafkatest.MaxWait,
		SessionTimeout:    kafkatest.SessionTimeout,
		HeartbeatInterval: kafkatest.HeartbeatInterval,
		RebalanceTimeout:  5 * time.Second,
		RevokeTimeout:     2 * time.Second,
		JoinGroupBackoff:  200 * time.Millisecond,
		Logger:            cfg.Logger,
	})
}

// TestKafka runs sources/kafka through the failovers of RunKafka.
func TestKafka(t *testing.T) { RunKafka(t, kafkaGo) }
