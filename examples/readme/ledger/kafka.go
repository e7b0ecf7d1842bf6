package ledger

import (
	"context"

	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
)

// RunKafka books the transfers of the Kafka topic "transfers", read as the
// consumer group "ledger", until ctx is done.
func RunKafka(ctx context.Context, pool *pgxpool.Pool, brokers []string) error {
	src, err := kafka.New(pool, kafka.Config{Brokers: brokers, Group: "ledger", Topics: []string{"transfers"}})
	if err != nil {
		return err
	}
	defer src.Close()
	return Run(ctx, pool, src) // Migrate also creates the table of Kafka offsets
}
