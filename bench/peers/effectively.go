package peers

import (
	"context"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5"
)

// Batch is the consumer's BatchSize for every shape.
const Batch = 500

// Shape is a handler shape of this library's consumer.
type Shape struct {
	Name string
	// Set puts into cfg the shape's handler, which writes one ledger row
	// per message.
	Set func(cfg *consumer.Config)
}

// Shapes are the handler shapes measured, in table order. Ratios are to
// the fastest of them. Table reports the target against the one
// named QueuedShape.
var Shapes = []Shape{
	{Name: "Handler", Set: func(cfg *consumer.Config) {
		cfg.Handler = consumer.JSON(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message, t transfer) error {
			_, err := tx.Exec(ctx, insertOne, t.ID, t.Account, t.Amount)
			return err
		})
	}},
	{Name: "BatchHandler", Set: func(cfg *consumer.Config) {
		cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
			ids := make([]string, len(msgs))
			accounts := make([]string, len(msgs))
			amounts := make([]int64, len(msgs))
			for i, m := range msgs {
				t, err := parse(m.Value)
				if err != nil {
					return consumer.Permanent(err)
				}
				ids[i], accounts[i], amounts[i] = t.ID, t.Account, t.Amount
			}
			_, err := tx.Exec(ctx, `INSERT INTO ledger (msg_id, account, amount)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`, ids, accounts, amounts)
			return err
		}
	}},
	{Name: QueuedShape, Set: func(cfg *consumer.Config) {
		cfg.QueueHandler = consumer.JSONQueue(func(_ context.Context, q consumer.Queue, _ *consumer.Message, t transfer) error {
			q.Queue(insertOne, t.ID, t.Account, t.Amount)
			return nil
		})
	}},
}

// insertOne writes one message's ledger row.
const insertOne = `INSERT INTO ledger (msg_id, account, amount) VALUES ($1, $2, $3)`

// runEffectively consumes with sources/kafka and the consumer (idset,
// batches of Batch, the default Concurrency), handling with shape.
func runEffectively(shape Shape) runFunc {
	return func(ctx context.Context, spec Spec, p *progress) error {
		pool, err := openPool(ctx, spec.DB)
		if err != nil {
			return err
		}
		defer pool.Close()
		src, err := kafka.New(pool, kafka.Config{
			Brokers: spec.Brokers, Group: spec.Group, Topics: []string{spec.Topic},
			MaxWait: maxWait, SessionTimeout: spec.SessionTimeout, HeartbeatInterval: heartbeat(spec),
		})
		if err != nil {
			return err
		}
		defer src.Close()
		strategy, err := idset.New(idset.Config{})
		if err != nil {
			return err
		}
		cfg := consumer.Config{Name: "ledger", Strategy: strategy, BatchSize: Batch}
		shape.Set(&cfg)
		c, err := consumer.New(pool, &tracked{Source: src, p: p}, cfg)
		if err != nil {
			return err
		}
		return c.Run(ctx)
	}
}

// tracked is the Kafka source with the worker's progress reported: a batch
// in hand, and its messages committed and then acknowledged. Settle comes
// after the batch's transaction committed and before the source
// acknowledges to Kafka, which is where a crash is injected. Embedding the
// *kafka.Source keeps every optional interface the consumer looks for
// (BeforeCommit above all, which stores the offsets in the transaction).
type tracked struct {
	*kafka.Source
	p *progress
}

func (t *tracked) Fetch(ctx context.Context, max int) (*consumer.Batch, error) {
	b, err := t.Source.Fetch(ctx, max)
	if err == nil && b != nil && len(b.Messages) > 0 {
		t.p.inHand()
	}
	return b, err
}

func (t *tracked) Settle(ctx context.Context, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	t.p.commit(len(ack))
	err := t.Source.Settle(ctx, b, ack, retry)
	for _, m := range ack {
		if _, partition, offset, ok := kafka.Position(m); ok {
			t.p.settled(int32(partition), offset)
		}
	}
	return err
}

// Settings every consumer here shares.
const maxWait = 100 * time.Millisecond

// heartbeat is the group heartbeat interval for spec's session timeout.
func heartbeat(spec Spec) time.Duration { return min(500*time.Millisecond, spec.SessionTimeout/6) }
