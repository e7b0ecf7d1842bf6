package peers

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"
)

// runKafkaGo is the consumer teams write by hand with kafka-go and pgx:
// fetch a message, begin, insert, commit, commit the offset, one message
// at a time. With checkIDs, the transaction first inserts the message id
// into processed_ids and skips the effect when it was there already.
func runKafkaGo(checkIDs bool) runFunc {
	return func(ctx context.Context, spec Spec, p *progress) error {
		pool, err := openPool(ctx, spec.DB)
		if err != nil {
			return err
		}
		defer pool.Close()
		r := kafkago.NewReader(kafkago.ReaderConfig{
			Brokers: spec.Brokers, GroupID: spec.Group, Topic: spec.Topic,
			StartOffset: kafkago.FirstOffset, MaxWait: maxWait,
			SessionTimeout: spec.SessionTimeout, HeartbeatInterval: heartbeat(spec),
		})
		defer r.Close()
		for {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			p.inHand()
			t, err := parse(m.Value)
			if err != nil {
				return err
			}
			err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if checkIDs {
					tag, err := tx.Exec(ctx, `INSERT INTO processed_ids (msg_id) VALUES ($1) ON CONFLICT DO NOTHING`, t.ID)
					if err != nil || tag.RowsAffected() == 0 {
						return err
					}
				}
				_, err := tx.Exec(ctx, insertOne, t.ID, t.Account, t.Amount)
				return err
			})
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			p.commit(1)
			if err := r.CommitMessages(ctx, m); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				// A rebalance ended the generation: the message is
				// delivered again, here or to another member.
				log.Printf("commit offset %d of partition %d: %v", m.Offset, m.Partition, err)
				continue
			}
			p.settled(int32(m.Partition), m.Offset)
		}
	}
}
