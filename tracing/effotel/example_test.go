package effotel_test

import (
	"context"
	"log"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/tracing/effotel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Trace every batch of a consumer.
func ExampleNew() {
	var pool *pgxpool.Pool                                            // your database
	var src consumer.Source = consumertest.New(consumertest.Config{}) // your Kafka or SQS source

	// Your provider, with its exporter; without one, the global provider
	// is used.
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tracer := effotel.New(effotel.Options{
		TracerProvider: tp,
		Attributes:     []attribute.KeyValue{attribute.String("messaging.destination.name", "orders")},
	})

	strategy, err := idset.New(idset.Config{})
	if err != nil {
		log.Fatal(err)
	}
	_, err = consumer.New(pool, src, consumer.Config{
		Name:     "orders",
		Strategy: strategy,
		// ctx carries the batch span: spans started from it are its children.
		Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			return nil // apply m with tx
		},
		Hooks: []consumer.Hook{tracer},
	})
	_ = err
}
