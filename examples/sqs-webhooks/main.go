// Command sqs-webhooks is a webhook-ingest worker. A front door (an HTTP
// endpoint, or SNS) puts provider webhooks on an SQS queue, and this worker
// stores each event once in PostgreSQL, although providers redeliver
// aggressively (every timeout, every 5xx, sometimes just because) and SQS
// itself delivers at least once.
//
// The dedupe key is the provider's event ID from the payload ("id"), so a
// provider's redelivery, which arrives as a new SQS message, is recognised.
// An event that cannot be read (not JSON, no id) is parked in Postgres with
// the reason; the worker goes on.
//
// Run it against a real queue:
//
//	SQS_QUEUE_URL=https://sqs.eu-west-1.amazonaws.com/123456789012/webhooks \
//	DATABASE_URL=postgres://... go run ./examples/sqs-webhooks
//
// or as a self-checking demo that creates a queue, publishes webhooks with
// redeliveries and a few broken ones, processes them and checks that every
// event was stored once:
//
//	npm ci --prefix internal/fauxqs    # once: the SQS emulator
//	go run ./examples/sqs-webhooks -demo
//
// Environment:
//   - SQS_QUEUE_URL, or SQS_QUEUE (a queue name, default "webhooks");
//   - SQS_ENDPOINT: an SQS endpoint to use instead of AWS (an emulator). When
//     unset, the AWS default chain supplies region and credentials. With
//     -demo and no SQS_ENDPOINT, the bundled emulator is started;
//   - SQS_SNS=1: the queue receives SNS notifications without raw delivery;
//   - DATABASE_URL: PostgreSQL. With -demo and no DATABASE_URL, a throwaway
//     server is started.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/sqs"
)

// Webhook is the part of a provider's event the worker reads.
type Webhook struct {
	ID   string          `json:"id"`
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"`
}

// store is the business effect: one row per event, in the transaction that
// also records the event ID as processed. It queues its INSERT, so that
// the batch's rows go to PostgreSQL in one round trip.
func store(ctx context.Context, q consumer.Queue, m *consumer.Message, w Webhook) error {
	if w.Type == "" {
		return consumer.Permanent(fmt.Errorf("event %s has no type", w.ID))
	}
	provider, _ := m.Header("provider")
	q.Queue(`INSERT INTO webhook_events (event_id, provider, type, data, sqs_message_id, received_at)
		VALUES ($1, $2, $3, $4, $5, $6)`, w.ID, string(provider), w.Type, []byte(w.Data), m.Ref, m.Time)
	return nil
}

const schemaSQL = `CREATE TABLE IF NOT EXISTS webhook_events (
    event_id       text        NOT NULL,
    provider       text        NOT NULL,
    type           text        NOT NULL,
    data           jsonb,
    sqs_message_id text        NOT NULL,
    received_at    timestamptz NOT NULL,
    stored_at      timestamptz NOT NULL DEFAULT now()
)`

func main() {
	demo := flag.Bool("demo", false, "create a queue, publish webhooks with redeliveries, process them and check the result")
	events := flag.Int("events", 2000, "webhooks to publish in -demo mode")
	verbose := flag.Bool("v", false, "log the source's and consumer's messages")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if *verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if err := run(ctx, *demo, *events, logger); err != nil {
		fmt.Fprintln(os.Stderr, "sqs-webhooks:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, demo bool, events int, logger *slog.Logger) error {
	endpoint := os.Getenv("SQS_ENDPOINT")
	if demo && endpoint == "" {
		fmt.Println("starting the SQS emulator (set SQS_ENDPOINT to use another endpoint)…")
		srv, err := fauxqs.Start(ctx)
		if err != nil {
			return err
		}
		defer srv.Stop()
		endpoint = srv.URL
	}
	client, err := newClient(ctx, endpoint)
	if err != nil {
		return err
	}

	if os.Getenv("DATABASE_URL") == "" && !demo {
		return errors.New("DATABASE_URL is not set: for the self-checking demo on a throwaway PostgreSQL and the bundled SQS emulator, run `go run ./examples/sqs-webhooks -demo` (after `make deps`, which installs the emulator's npm packages); to consume a real queue, set DATABASE_URL and SQS_QUEUE_URL (or SQS_QUEUE)")
	}
	pool, closeDB, err := pgtest.EnvPool(ctx, pgtest.Options{}, os.Stdout) // DATABASE_URL, or with -demo a throwaway server
	if err != nil {
		return err
	}
	defer closeDB()
	if _, err := pool.Exec(ctx, schemaSQL); err != nil {
		return err
	}

	queueURL, queueName := os.Getenv("SQS_QUEUE_URL"), os.Getenv("SQS_QUEUE")
	scope := "webhooks"
	var d *demoRun
	if demo {
		// A fresh scope and queue per run, so the demo can run again on the
		// same database.
		scope = fmt.Sprintf("webhooks-demo-%d", time.Now().UnixNano())
		d, err = publishDemo(ctx, client, scope, events)
		if err != nil {
			return err
		}
		queueURL = d.queueURL
	} else if queueURL == "" && queueName == "" {
		queueName = "webhooks"
	}

	src, err := sqs.New(ctx, sqs.Config{
		Client:      client,
		QueueURL:    queueURL,
		QueueName:   queueName,
		Receivers:   4,
		SNSEnvelope: os.Getenv("SQS_SNS") == "1",
		Logger:      logger,
	})
	if err != nil {
		return err
	}
	defer src.Close()

	strategy, err := idset.New(idset.Config{Retention: 14 * 24 * time.Hour, Logger: logger})
	if err != nil {
		return err
	}
	counts := &counter{}
	c, err := consumer.New(pool, src, consumer.Config{
		Name:     "webhooks",
		Scope:    scope,
		Strategy: strategy,
		// Providers redeliver an event as a new SQS message: key on the
		// event's own ID. sqs.ParkUnreadable parks messages the source
		// could not read (an SNS envelope that is not JSON) with the reason.
		KeyFunc:      sqs.ParkUnreadable(consumer.JSONField("id")),
		QueueHandler: consumer.JSONQueue(store),
		BatchSize:    100,
		RetryBackoff: 500 * time.Millisecond,
		Logger:       logger,
		Hooks:        []consumer.Hook{counts},
	})
	if err != nil {
		return err
	}
	if err := c.Migrate(ctx); err != nil {
		return err
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	fmt.Printf("consuming %s\n", src.QueueURL())

	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
		}
		s := counts.get()
		fmt.Printf("\r  stored %6d   duplicates %6d   parked %3d", s.Applied, s.Duplicate+s.Mismatch, s.Parked)
		if d != nil && s.Applied >= len(d.events) && drained(ctx, client, queueURL) {
			cancel()
			if err := <-done; err != nil {
				return err
			}
			fmt.Println()
			return d.check(ctx, pool)
		}
	}
}

// newClient builds an SQS client from the AWS default chain, pointed at
// endpoint when it is set (an emulator accepts any credentials).
func newClient(ctx context.Context, endpoint string) (*awssqs.Client, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if endpoint != "" {
		if os.Getenv("AWS_REGION") == "" && os.Getenv("AWS_DEFAULT_REGION") == "" {
			opts = append(opts, awsconfig.WithRegion("us-east-1"))
		}
		if os.Getenv("AWS_ACCESS_KEY_ID") == "" {
			opts = append(opts, awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
		}
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, err
	}
	return awssqs.NewFromConfig(cfg, func(o *awssqs.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
	}), nil
}

// drained reports whether the queue holds no message, visible or in flight.
func drained(ctx context.Context, c *awssqs.Client, queueURL string) bool {
	out, err := c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(queueURL),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible},
	})
	if err != nil {
		return false
	}
	return out.Attributes["ApproximateNumberOfMessages"] == "0" && out.Attributes["ApproximateNumberOfMessagesNotVisible"] == "0"
}
