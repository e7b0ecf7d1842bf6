package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// demoRun is what -demo published and expects to find.
type demoRun struct {
	queueURL string
	scope    string
	events   []string // event IDs that must be stored once each
	broken   int      // webhooks that must be parked
}

// publishDemo creates a queue and publishes n webhooks; a quarter of them
// are redelivered by the "provider" (a second SQS message with the same
// event ID), and a few are broken: not JSON, or without an event type.
func publishDemo(ctx context.Context, c *awssqs.Client, scope string, n int) (*demoRun, error) {
	q, err := c.CreateQueue(ctx, &awssqs.CreateQueueInput{QueueName: aws.String(scope)})
	if err != nil {
		return nil, fmt.Errorf("create queue: %w", err)
	}
	d := &demoRun{queueURL: aws.ToString(q.QueueUrl), scope: scope}
	rng := rand.New(rand.NewPCG(7, 11))
	providers := []string{"stripe", "github", "shopify"}
	var bodies []types.SendMessageBatchRequestEntry
	add := func(body, provider string) {
		bodies = append(bodies, types.SendMessageBatchRequestEntry{
			Id:          aws.String(strconv.Itoa(len(bodies) % 10)),
			MessageBody: aws.String(body),
			MessageAttributes: map[string]types.MessageAttributeValue{
				"provider": {DataType: aws.String("String"), StringValue: aws.String(provider)},
			},
		})
	}
	for i := range n {
		id := fmt.Sprintf("%s/evt_%06d", scope, i)
		provider := providers[rng.IntN(len(providers))]
		body := fmt.Sprintf(`{"id":%q,"type":"invoice.paid","data":{"amount":%d}}`, id, rng.IntN(100000))
		switch {
		case i%400 == 199:
			add(`demo-broken: <html>502 Bad Gateway</html>`, provider)
			d.broken++
			continue
		case i%400 == 399:
			add(fmt.Sprintf(`{"id":%q,"data":"demo-broken: no type"}`, id), provider)
			d.broken++
			continue
		}
		d.events = append(d.events, id)
		add(body, provider)
		if rng.IntN(4) == 0 {
			add(body, provider) // the provider timed out waiting and sent it again
		}
	}
	rng.Shuffle(len(bodies), func(i, j int) { bodies[i], bodies[j] = bodies[j], bodies[i] })

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	batches := make(chan []types.SendMessageBatchRequestEntry)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				for j := range b {
					b[j].Id = aws.String(strconv.Itoa(j))
				}
				out, err := c.SendMessageBatch(ctx, &awssqs.SendMessageBatchInput{QueueUrl: q.QueueUrl, Entries: b})
				if err == nil && len(out.Failed) > 0 {
					err = fmt.Errorf("send: %s", aws.ToString(out.Failed[0].Message))
				}
				if err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for start := 0; start < len(bodies); start += 10 {
		batches <- bodies[start:min(start+10, len(bodies))]
	}
	close(batches)
	wg.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	fmt.Printf("published %d SQS messages: %d events, some of them twice, and %d broken webhooks\n", len(bodies), len(d.events), d.broken)
	return d, nil
}

// check verifies that every event was stored exactly once and the broken
// webhooks were parked.
func (d *demoRun) check(ctx context.Context, pool *pgxpool.Pool) error {
	rows, err := pool.Query(ctx, `SELECT event_id, count(*) FROM webhook_events WHERE event_id LIKE $1 || '/%' GROUP BY event_id`, d.scope)
	if err != nil {
		return err
	}
	got := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { got[id] = n; return nil }); err != nil {
		return err
	}
	var bad []string
	for _, id := range d.events {
		if got[id] != 1 {
			bad = append(bad, fmt.Sprintf("%s stored %d times", id, got[id]))
		}
	}
	if len(got) != len(d.events) {
		bad = append(bad, fmt.Sprintf("%d distinct events stored, want %d", len(got), len(d.events)))
	}
	// The consumer's parked messages, through the parked table's store:
	// the rows of the run's scope.
	parked, err := parked.NewStore(pool, "", "").Count(ctx, parked.Filter{Scope: d.scope})
	if err != nil {
		return err
	}
	if parked != int64(d.broken) {
		bad = append(bad, fmt.Sprintf("%d webhooks parked, want %d", parked, d.broken))
	}
	if len(bad) > 0 {
		return fmt.Errorf("check failed: %s", strings.Join(bad[:min(5, len(bad))], "; "))
	}
	fmt.Printf("ok: %d events stored exactly once, %d broken webhooks parked with their reasons (effectively parked list --scope %s)\n", len(d.events), parked, d.scope)
	return nil
}

// counter totals the consumer's batch statistics.
type counter struct {
	mu    sync.Mutex
	total consumer.BatchStats
}

func (c *counter) BatchDone(_ context.Context, s *consumer.BatchStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total.Applied += s.Applied
	c.total.Duplicate += s.Duplicate
	c.total.Mismatch += s.Mismatch
	c.total.Parked += s.Parked
}

func (c *counter) get() consumer.BatchStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total
}
