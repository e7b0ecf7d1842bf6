package peers

import (
	"context"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
)

// runWatermill consumes with Watermill's Kafka subscriber and router: the
// router's Deduplicator middleware, keyed by hasher (nil: as shipped, an
// Adler-32 checksum of the payload), in front of a handler that writes
// the ledger row in a pgx transaction.
func runWatermill(hasher middleware.MessageHasher) runFunc {
	return func(ctx context.Context, spec Spec, p *progress) error {
		pool, err := openPool(ctx, spec.DB)
		if err != nil {
			return err
		}
		defer pool.Close()

		sc := wkafka.DefaultSaramaSubscriberConfig()
		sc.Consumer.Offsets.Initial = sarama.OffsetOldest
		sc.Consumer.MaxWaitTime = maxWait
		sc.Consumer.Group.Session.Timeout = spec.SessionTimeout
		sc.Consumer.Group.Heartbeat.Interval = heartbeat(spec)
		sub, err := wkafka.NewSubscriber(wkafka.SubscriberConfig{
			Brokers:               spec.Brokers,
			Unmarshaler:           wkafka.DefaultMarshaler{},
			OverwriteSaramaConfig: sc,
			ConsumerGroup:         spec.Group,
		}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		defer sub.Close()

		router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				p.inHand()
				out, err := h(msg)
				if err == nil {
					partition, _ := wkafka.MessagePartitionFromCtx(msg.Context())
					offset, _ := wkafka.MessagePartitionOffsetFromCtx(msg.Context())
					p.settled(partition, offset)
				}
				return out, err
			}
		})
		dedup := &middleware.Deduplicator{KeyFactory: hasher}
		router.AddMiddleware(dedup.Middleware)
		router.AddConsumerHandler("ledger", spec.Topic, sub, func(msg *message.Message) error {
			t, err := parse(msg.Payload)
			if err != nil {
				return err
			}
			ctx := msg.Context()
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, insertOne, t.ID, t.Account, t.Amount)
				return err
			}); err != nil {
				return err
			}
			p.commit(1) // committed; the router acknowledges when this returns
			return nil
		})
		go func() {
			<-ctx.Done()
			_ = router.Close()
		}()
		return router.Run(ctx)
	}
}
