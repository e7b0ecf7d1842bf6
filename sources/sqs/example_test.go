package sqs_test

import (
	"context"
	"log"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/sources/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// An order worker on a standard queue whose producers set an
// idempotency-key attribute. Credentials and region come from the AWS
// default chain.
func ExampleNew() {
	ctx := context.Background()
	src, err := sqs.New(ctx, sqs.Config{
		QueueName:         "orders",
		Region:            "eu-west-1",
		VisibilityTimeout: 60 * time.Second, // renewed every 20s while held
	})
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close() // after Run returned

	pool, err := pgxpool.New(ctx, "postgres:///orders")
	if err != nil {
		log.Fatal(err)
	}
	strategy, err := idset.New(idset.Config{Retention: 14 * 24 * time.Hour}) // longer than the queue's retention
	if err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(pool, src, consumer.Config{
		Name:     "orders",
		Strategy: strategy,
		KeyFunc:  sqs.ParkUnreadable(nil), // park unreadable messages with the reason
		Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO orders (id, body) VALUES ($1, $2)`, m.DedupeKey.ID, m.Value)
			return err
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
