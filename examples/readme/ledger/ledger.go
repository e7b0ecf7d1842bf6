// Package ledger is a worker that books money transfers into a ledger
// table, each transfer once however often it is delivered. README.md shows
// its files as they are: see the package examples/readme.
package ledger

import (
	"context"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Transfer is a message's JSON payload:
// {"transfer_id": "t-1", "account": "alice", "amount": 100}.
type Transfer struct {
	ID      string `json:"transfer_id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// Table is the ledger table the handler writes (yours, not the library's).
const Table = `CREATE TABLE IF NOT EXISTS ledger (transfer_id text NOT NULL, account text NOT NULL, amount bigint NOT NULL)`

// NewConsumer returns a consumer that books each transfer from source once.
func NewConsumer(pool *pgxpool.Pool, source consumer.Source) (*consumer.Consumer, error) {
	strategy, err := idset.New(idset.Config{Retention: 14 * 24 * time.Hour}) // longer than the broker keeps a message
	if err != nil {
		return nil, err
	}
	return consumer.New(pool, source, consumer.Config{
		Name:     "ledger", // also the dedupe scope
		Strategy: strategy,
		KeyFunc:  consumer.JSONField("transfer_id"), // the dedupe ID
		Handler: consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, t Transfer) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger (transfer_id, account, amount) VALUES ($1, $2, $3)`,
				t.ID, t.Account, t.Amount)
			return err // an error rolls back this message's effect and marker; it is retried, then parked
		}),
	})
}

// Run creates the library's tables if they are missing, then books
// transfers from source until ctx is done.
func Run(ctx context.Context, pool *pgxpool.Pool, source consumer.Source) error {
	c, err := NewConsumer(pool, source)
	if err != nil {
		return err
	}
	if err := c.Migrate(ctx); err != nil { // or hand a DBA the SQL: pg.MigrationSQL
		return err
	}
	return c.Run(ctx) // returns after in-flight batches committed and were acknowledged
}
