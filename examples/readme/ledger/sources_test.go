package ledger_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/examples/readme/ledger"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

// The README's Kafka and SQS functions, run against the in-process Kafka and
// the SQS emulator the rest of the suite uses. Each source delivers t-1 twice,
// as a producer that retried its send would.

var transfers = []string{
	`{"transfer_id": "t-1", "account": "alice", "amount": 100}`,
	`{"transfer_id": "t-2", "account": "bob", "amount": -40}`,
	`{"transfer_id": "t-1", "account": "alice", "amount": 100}`,
	`{"transfer_id": "t-3", "account": "carol", "amount": 75}`,
}

func TestRunKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an in-process Kafka cluster")
	}
	t.Parallel()
	ctx := context.Background()
	pool := newLedgerDB(t)
	k := kafkatest.New(t)
	if err := k.CreateTopic(ctx, "transfers", 2); err != nil {
		t.Fatal(err)
	}
	var msgs []kafkago.Message
	for i, body := range transfers {
		msgs = append(msgs, kafkago.Message{Partition: i % 2, Value: []byte(body)})
	}
	if err := k.Produce(ctx, "transfers", msgs...); err != nil {
		t.Fatal(err)
	}

	r := runInBackground(t, func(ctx context.Context) error { return ledger.RunKafka(ctx, pool, k.Brokers()) })
	// Done when every record's offset is committed, in the batch
	// transactions: read from the offsets table's owner.
	offsets := kafka.NewOffsets("", "")
	waitFor(t, r, "all records committed", func() (bool, error) {
		if ok, err := offsets.Exists(ctx, pool); !ok || err != nil {
			return false, err // not created by the consumer yet, or an error
		}
		stored, err := offsets.Read(ctx, pool, "ledger", "transfers", []int{0, 1})
		if err != nil {
			return false, err
		}
		var n int64
		for _, o := range stored {
			if o.Next != nil {
				n += *o.Next
			}
		}
		return n == int64(len(transfers)), nil
	})
	r.stop(t)
	checkLedger(t, pool)
}

func TestRunSQS(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the SQS emulator")
	}
	// RunSQS takes its endpoint, region and credentials from the AWS default
	// chain, as in production; point the chain at the emulator.
	endpoint := fauxqs.Endpoint(t)
	t.Setenv("AWS_ENDPOINT_URL_SQS", endpoint)
	t.Setenv("AWS_REGION", fauxqs.Region)
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	ctx := context.Background()
	pool := newLedgerDB(t)
	client := fauxqs.NewClient(endpoint)
	queue := fauxqs.NewQueue(t, client, "transfers", nil)
	for _, body := range transfers {
		if _, err := client.SendMessage(ctx, &awssqs.SendMessageInput{QueueUrl: aws.String(queue), MessageBody: aws.String(body)}); err != nil {
			t.Fatal(err)
		}
	}

	r := runInBackground(t, func(ctx context.Context) error { return ledger.RunSQS(ctx, pool, queue) })
	// Done when every message is deleted, which happens after its transaction.
	waitFor(t, r, "the queue emptied", func() (bool, error) {
		out, err := client.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{
			QueueUrl: aws.String(queue),
			AttributeNames: []types.QueueAttributeName{
				types.QueueAttributeNameApproximateNumberOfMessages,
				types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
			},
		})
		if err != nil {
			return false, err
		}
		visible, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
		inFlight, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
		return visible+inFlight == 0, nil
	})
	r.stop(t) // takes up to 20s: Close lets the long polls in progress end (sqs.Config.WaitTime)
	checkLedger(t, pool)
}

func newLedgerDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.NewPool(t)
	if _, err := pool.Exec(context.Background(), ledger.Table); err != nil {
		t.Fatal(err)
	}
	return pool
}

// runner is a function running in the background until stop.
type runner struct {
	cancel context.CancelFunc
	done   chan error
	err    error
	ended  bool
}

// runInBackground runs run until the runner's stop is called.
func runInBackground(t *testing.T, run func(context.Context) error) *runner {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// returned reports whether run has returned, and with what.
func (r *runner) returned() (bool, error) {
	if !r.ended {
		select {
		case r.err = <-r.done:
			r.ended = true
		default:
		}
	}
	return r.ended, r.err
}

// stop cancels run's context, waits for it to return and fails t if it
// returned an error.
func (r *runner) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	if !r.ended {
		r.err, r.ended = <-r.done, true
	}
	if r.err != nil {
		t.Fatalf("run: %v", r.err)
	}
}

// waitFor polls cond until it holds; it fails t if cond returns an error,
// if r returns first, or if cond does not hold within a minute (a guard
// against a hung test, not a performance assertion).
func waitFor(t *testing.T, r *runner, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if ended, err := r.returned(); ended {
			t.Fatalf("run returned before %s: %v", what, err)
		}
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within a minute", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkLedger checks that t-1, t-2 and t-3 were each booked once.
func checkLedger(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	booked := consumertest.EffectCounts(t, pool, "ledger", "transfer_id")
	want := map[string]int{"t-1": 1, "t-2": 1, "t-3": 1}
	if len(booked) != len(want) {
		t.Errorf("booked %v, want %v", booked, want)
	}
	for id, n := range want {
		if booked[id] != n {
			t.Errorf("transfer %s booked %d times, want %d", id, booked[id], n)
		}
	}
}

// Serve: a client posts t-1 three times with one Idempotency-Key and gets
// the same 201 each time; the bank delivers t-2 twice, signed; a delivery
// with a wrong signature is refused. The ledger books each transfer once.
func TestServe(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newLedgerDB(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const secret = "whsec_test"
	r := runInBackground(t, func(ctx context.Context) error {
		return ledger.Serve(ctx, pool, ln, secret, map[string]string{"sk_client_1": "client-1"})
	})
	url := "http://" + ln.Addr().String()
	post := func(path string, header map[string]string, body string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// The webhook answers 503 until its consumer fetches: wait for that.
	signed := func(body, key string) map[string]string {
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		mac := hmac.New(sha256.New, []byte(key))
		mac.Write([]byte(ts + "." + body))
		return map[string]string{"Stripe-Signature": "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))}
	}
	waitFor(t, r, "the webhook's consumer running", func() (bool, error) {
		return post("/webhooks/bank", signed(transfers[1], secret), transfers[1]) == http.StatusOK, nil
	})
	if got := post("/webhooks/bank", signed(transfers[1], secret), transfers[1]); got != http.StatusOK {
		t.Fatalf("second delivery of t-2: %d, want 200", got)
	}
	if got := post("/webhooks/bank", signed(transfers[3], "whsec_wrong"), transfers[3]); got != http.StatusUnauthorized {
		t.Fatalf("a delivery with a wrong signature: %d, want 401", got)
	}
	for range 3 {
		if got := post("/transfers", map[string]string{"Idempotency-Key": "k-1", "Authorization": "Bearer sk_client_1"}, transfers[0]); got != http.StatusCreated {
			t.Fatalf("POST /transfers: %d, want 201", got)
		}
	}
	if got := post("/transfers", map[string]string{"Idempotency-Key": "k-1", "Authorization": "Bearer sk_forged"}, transfers[0]); got != http.StatusBadRequest {
		t.Fatalf("POST /transfers with an unknown API key: %d, want 400", got)
	}
	r.stop(t)
	var rows, distinct int
	if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT transfer_id) FROM ledger`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != 2 || distinct != 2 {
		t.Fatalf("%d ledger rows for %d transfers, want t-1 and t-2 once each", rows, distinct)
	}
}
