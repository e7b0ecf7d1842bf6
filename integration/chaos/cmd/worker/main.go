// Command worker is one member of the chaos test's consumer group over
// sources/kafka: the shared chaos worker (package integration/chaos/worker)
// with a kafka.Source. kafka-go's groups have no static membership: the
// worker ignores -instance-id and joins as a dynamic member.
package main

import (
	"github.com/effectively-once/effectively/integration/chaos/worker"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	worker.Main(worker.Kafka{
		New: func(pool *pgxpool.Pool, o worker.Options) (worker.Source, error) {
			return kafka.New(pool, kafka.Config{
				Brokers:           o.Brokers,
				Group:             o.Group,
				Topics:            o.Topics,
				MaxWait:           o.MaxWait,
				SessionTimeout:    o.Session,
				HeartbeatInterval: o.Heartbeat,
				RebalanceTimeout:  o.Rebalance,
				Logger:            o.Logger,
			})
		},
		Position: kafka.Position,
	})
}
