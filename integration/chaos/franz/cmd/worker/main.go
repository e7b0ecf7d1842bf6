// Command worker is one member of the chaos test's consumer group over
// sources/franz: the shared chaos worker (package worker) with a
// franz.Source configured like sources/kafka's worker, a static member of
// the group when the driver gives it an instance ID (-instance-id).
package main

import (
	"time"

	"github.com/effectively-once/effectively/integration/chaos/worker"
	"github.com/effectively-once/effectively/sources/franz"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	worker.Main(worker.Kafka{
		New: func(pool *pgxpool.Pool, o worker.Options) (worker.Source, error) {
			return franz.New(pool, franz.Config{
				Brokers:    o.Brokers,
				Group:      o.Group,
				Topics:     o.Topics,
				InstanceID: o.InstanceID,
				Opts: []kgo.Opt{
					kgo.SessionTimeout(o.Session),
					kgo.HeartbeatInterval(o.Heartbeat),
					kgo.RebalanceTimeout(o.Rebalance),
					kgo.FetchMaxWait(o.MaxWait),
					// New topics and partitions are noticed within the
					// chaos run's bound (kgo's default is 5 minutes).
					kgo.MetadataMaxAge(5 * time.Second),
				},
				Logger: o.Logger,
			})
		},
		Position: franz.Position,
	})
}
