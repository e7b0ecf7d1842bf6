package franz

import (
	"testing"
	"time"

	"github.com/effectively-once/effectively/internal/failover"
)

// TestDatabaseFailover runs the invariant workload through a PostgreSQL
// primary failover (synchronous replication; asynchronous replication
// losing the last commits, with the consumer restarted or running on; and
// losing every commit of the group), as sources/kafka does: every message
// ends with exactly one effect.
func TestDatabaseFailover(t *testing.T) {
	failover.RunKafka(t, func(cfg failover.KafkaConfig) (failover.KafkaSource, error) {
		return New(cfg.Pool, Config{
			Brokers:       cfg.Brokers,
			Group:         cfg.Group,
			Topics:        []string{cfg.Topic},
			Opts:          groupOpts(),
			RevokeTimeout: 2 * time.Second,
			Logger:        cfg.Logger,
		})
	})
}
