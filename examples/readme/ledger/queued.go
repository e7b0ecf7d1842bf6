package ledger

import (
	"context"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/jackc/pgx/v5/pgxpool"
)

// NewQueuedConsumer books transfers as NewConsumer does, with a
// QueueHandler: the handler queues its INSERT, and the consumer sends the
// INSERTs of a whole batch in one round trip.
func NewQueuedConsumer(pool *pgxpool.Pool, source consumer.Source) (*consumer.Consumer, error) {
	strategy, err := idset.New(idset.Config{Retention: 14 * 24 * time.Hour})
	if err != nil {
		return nil, err
	}
	return consumer.New(pool, source, consumer.Config{
		Name:     "ledger",
		Strategy: strategy,
		KeyFunc:  consumer.JSONField("transfer_id"),
		QueueHandler: consumer.JSONQueue(func(ctx context.Context, q consumer.Queue, m *consumer.Message, t Transfer) error {
			q.Queue(`INSERT INTO ledger (transfer_id, account, amount) VALUES ($1, $2, $3)`,
				t.ID, t.Account, t.Amount)
			return nil // sent with the batch; if it fails, this message alone is retried, then parked
		}),
	})
}
