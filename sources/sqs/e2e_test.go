package sqs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/sources/sqs"
	"github.com/jackc/pgx/v5"
)

func keyed(prefix string, n int) []outgoing {
	return numbered(prefix, n, func(i int, m *outgoing) {
		m.Attrs = map[string]string{"idempotency-key": m.Body}
	})
}

func bodiesOf(out []outgoing) []string {
	s := make([]string, len(out))
	for i, o := range out {
		s[i] = o.Body
	}
	return s
}

// TestLostAckRedelivered: the deletes of some committed messages are lost;
// SQS delivers them again after the visibility timeout, the consumer
// recognises them as duplicates, deletes them, and applies nothing twice.
func TestLostAckRedelivered(t *testing.T) {
	t.Parallel()
	c := client(t)
	e := newE2E(t, fauxqs.NewQueue(t, c, "lostack", nil))
	msgs := keyed("m", 60)
	send(t, c, e.queue, msgs)

	var once sync.Map
	src := &faultySource{Source: e.source(sqs.Config{Receivers: 2}), drop: func(m *consumer.Message) bool {
		// Lose the first delete of every third message.
		var n int
		fmt.Sscanf(string(m.Value), "m-%d", &n)
		_, seen := once.LoadOrStore(m.Ref, true)
		return n%3 == 0 && !seen
	}}
	r := consumertest.Start(e.consumer(src, consumer.Config{BatchSize: 10}))
	e.waitFor("all messages applied and deleted", 30*time.Second, e.drained(len(msgs)))
	r.Stop(t)

	e.expectOnce(bodiesOf(msgs))
	if lost, dup := src.lostAcks(), e.hooks.Total().Duplicate; lost != 20 || dup < lost {
		t.Fatalf("lost %d acks and saw %d duplicates; want 20 lost, each redelivered as a duplicate", lost, dup)
	}
}

// TestCrashAfterCommitBeforeDelete: the process dies after its transaction
// committed and before the delete; a new process receives the messages
// again, recognises them and deletes them.
func TestCrashAfterCommitBeforeDelete(t *testing.T) {
	t.Parallel()
	c := client(t)
	e := newE2E(t, fauxqs.NewQueue(t, c, "crash", nil))
	msgs := keyed("m", 40)
	send(t, c, e.queue, msgs[:20])

	// First process: it dies after each commit, before the delete: nothing
	// it commits is deleted.
	first := &faultySource{Source: e.source(sqs.Config{Receivers: 2}), drop: func(*consumer.Message) bool { return true }}
	r := consumertest.Start(e.consumer(first, consumer.Config{BatchSize: 10}))
	e.waitFor("the first 20 committed", 20*time.Second, func() bool { return len(e.effectCounts()) == 20 })
	r.Stop(t)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if v, f := queueDepth(t, c, e.queue); v+f != 20 {
		t.Fatalf("after the crash the queue holds %d messages, want the 20 never deleted", v+f)
	}

	// Second process, with more messages arriving.
	send(t, c, e.queue, msgs[20:])
	second := e.source(sqs.Config{Receivers: 2})
	r = consumertest.Start(e.consumer(second, consumer.Config{BatchSize: 10}))
	e.waitFor("everything applied and deleted", 30*time.Second, e.drained(len(msgs)))
	r.Stop(t)

	e.expectOnce(bodiesOf(msgs))
	if st := e.hooks.Total(); st.Duplicate < 20 {
		t.Fatalf("stats %+v: want the 20 redelivered messages recognised as duplicates", st)
	}
}

// TestSlowHandlerKeptInvisible: a handler slower than the visibility
// timeout; the heartbeat keeps its message from a second consumer polling
// the same queue, so it is delivered and applied once.
func TestSlowHandlerKeptInvisible(t *testing.T) {
	t.Parallel()
	c := client(t)
	e := newE2E(t, fauxqs.NewQueue(t, c, "slow", nil))
	send(t, c, e.queue, keyed("slow", 1))

	var calls atomic.Int32
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		calls.Add(1)
		time.Sleep(5 * time.Second) // 2.5 visibility timeouts
		return insertEffect(ctx, tx, m)
	}
	cfg := sqs.Config{Receivers: 1, VisibilityTimeout: 2 * time.Second, HeartbeatInterval: 500 * time.Millisecond}
	srcA, srcB := e.source(cfg), e.source(cfg)
	ra := consumertest.Start(e.consumer(srcA, consumer.Config{Handler: handler}))
	rb := consumertest.Start(e.consumer(srcB, consumer.Config{Handler: handler}))
	e.waitFor("the slow message applied and deleted", 30*time.Second, e.drained(1))
	// Give a redelivery, if there were one, time to show.
	time.Sleep(time.Second)
	ra.Stop(t)
	rb.Stop(t)

	e.expectOnce([]string{"slow-0"})
	received := srcA.Stats().Received + srcB.Stats().Received
	if calls.Load() != 1 || received != 1 {
		t.Fatalf("handler ran %d times, the message was received %d times; want once each", calls.Load(), received)
	}
	if renewed := srcA.Stats().Renewed + srcB.Stats().Renewed; renewed < 3 {
		t.Fatalf("%d visibility renewals, want several", renewed)
	}
}

// TestFIFOOrderAcrossRetries: on a FIFO queue, each group's effects are in
// send order although one message of every group fails once, and groups
// are handled in parallel.
func TestFIFOOrderAcrossRetries(t *testing.T) {
	t.Parallel()
	c := client(t)
	e := newE2E(t, fauxqs.NewQueue(t, c, "fifo.fifo", nil))
	const groups, per = 4, 12
	var msgs []outgoing
	for i := range per {
		for g := range groups {
			group := fmt.Sprintf("g%d", g)
			msgs = append(msgs, outgoing{Body: fmt.Sprintf("%s-%02d", group, i), Group: group, DedupeID: fmt.Sprintf("%s-%02d", group, i)})
		}
	}
	send(t, c, e.queue, msgs)

	var active, maxActive atomic.Int32
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		n := active.Add(1)
		defer active.Add(-1)
		for {
			old := maxActive.Load()
			if n <= old || maxActive.CompareAndSwap(old, n) {
				break
			}
		}
		if strings.HasSuffix(string(m.Value), "-03") && m.Attempt == 1 {
			return errors.New("transient failure")
		}
		time.Sleep(20 * time.Millisecond)
		return insertEffect(ctx, tx, m)
	}
	src := e.source(sqs.Config{Receivers: 4})
	r := consumertest.Start(e.consumer(src, consumer.Config{Handler: handler, Concurrency: 4, BatchSize: 10}))
	e.waitFor("all groups applied and deleted", 60*time.Second, e.drained(len(msgs)))
	r.Stop(t)

	rows, err := e.pool.Query(context.Background(), `SELECT lane, msg_id FROM effects ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	order := map[string][]string{}
	var lane, id string
	if _, err := pgx.ForEachRow(rows, []any{&lane, &id}, func() error { order[lane] = append(order[lane], id); return nil }); err != nil {
		t.Fatal(err)
	}
	for g := range groups {
		group := fmt.Sprintf("g%d", g)
		got := order["group/"+group]
		if len(got) != per {
			t.Fatalf("group %s: %d effects, want %d", group, len(got), per)
		}
		for i, id := range got {
			if want := fmt.Sprintf("%s-%02d", group, i); id != want {
				t.Fatalf("group %s applied out of order: %v", group, got)
			}
		}
	}
	if st := e.hooks.Total(); st.Retried != groups {
		t.Fatalf("stats %+v: want %d retries", st, groups)
	}
	if maxActive.Load() < 2 {
		t.Fatalf("at most %d handlers ran at once: groups did not proceed in parallel", maxActive.Load())
	}
}

// TestProducerDuplicates: a producer sends each message three times with the
// same idempotency-key (three MessageIds): one effect each.
func TestProducerDuplicates(t *testing.T) {
	t.Parallel()
	c := client(t)
	e := newE2E(t, fauxqs.NewQueue(t, c, "dups", nil))
	msgs := keyed("m", 50)
	send(t, c, e.queue, append(append(append([]outgoing(nil), msgs...), msgs...), msgs...))

	r := consumertest.Start(e.consumer(e.source(sqs.Config{Receivers: 4}), consumer.Config{BatchSize: 20}))
	e.waitFor("all copies handled", 30*time.Second, e.drained(len(msgs)))
	r.Stop(t)

	e.expectOnce(bodiesOf(msgs))
	if st := e.hooks.Total(); st.Applied != 50 || st.Duplicate != 100 {
		t.Fatalf("stats %+v: want 50 applied and 100 duplicates", st)
	}
}

func poisonHandler(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	if string(m.Value) == "poison" {
		return errors.New("cannot handle this")
	}
	return insertEffect(ctx, tx, m)
}

// TestPoisonParked: a message that always fails is retried, then parked with
// its reason and deleted from the queue; the others are applied.
func TestPoisonParked(t *testing.T) {
	t.Parallel()
	c := client(t)
	e := newE2E(t, fauxqs.NewQueue(t, c, "poison", nil))
	msgs := keyed("m", 20)
	send(t, c, e.queue, append(msgs, outgoing{Body: "poison", Attrs: map[string]string{"idempotency-key": "poison"}}))

	r := consumertest.Start(e.consumer(e.source(sqs.Config{Receivers: 2}), consumer.Config{Handler: poisonHandler, MaxAttempts: 3}))
	e.waitFor("the poison parked and the queue empty", 30*time.Second, func() bool {
		v, f := queueDepth(t, c, e.queue)
		return len(e.parked()) == 1 && v == 0 && f == 0
	})
	r.Stop(t)

	e.expectOnce(bodiesOf(msgs))
	p := e.parked()[0]
	if p.Reason != parked.ReasonMaxAttempts || p.Attempts != 3 || string(p.Payload) != "poison" || p.Source != "sqs" || p.Ref == "" ||
		!strings.Contains(p.LastError, "cannot handle this") {
		t.Fatalf("parked %+v: want the poison message, max_attempts after 3 attempts", p)
	}
	if st := e.hooks.Total(); st.Retried != 2 {
		t.Fatalf("stats %+v: want 2 retries before parking", st)
	}
}

// TestPoisonLeftToRedrive: with UseQueueRedrive, the consumer keeps retrying
// and SQS moves the poison message to the dead-letter queue; nothing is
// parked in Postgres.
func TestPoisonLeftToRedrive(t *testing.T) {
	t.Parallel()
	c := client(t)
	dlq := fauxqs.NewQueue(t, c, "poison-dlq", nil)
	queue := fauxqs.NewQueue(t, c, "redrive", map[string]string{
		"RedrivePolicy": `{"deadLetterTargetArn":"` + queueARN(t, c, dlq) + `","maxReceiveCount":"2"}`,
	})
	e := newE2E(t, queue)
	msgs := keyed("m", 10)
	send(t, c, e.queue, append(msgs, outgoing{Body: "poison", Attrs: map[string]string{"idempotency-key": "poison"}}))

	src := e.source(sqs.Config{Receivers: 2, UseQueueRedrive: true})
	r := consumertest.Start(e.consumer(src, consumer.Config{Handler: poisonHandler, MaxAttempts: 1}))
	e.waitFor("the poison in the dead-letter queue", 30*time.Second, func() bool {
		v, _ := queueDepth(t, c, dlq)
		return v == 1 && e.drained(len(msgs))()
	})
	r.Stop(t)

	e.expectOnce(bodiesOf(msgs))
	if p := e.parked(); len(p) != 0 {
		t.Fatalf("parked %+v; want nothing parked: the queue's redrive policy handles the poison", p)
	}
	got := receiveRaw(t, c, dlq, time.Second)
	if len(got) != 1 || *got[0].Body != "poison" {
		t.Fatalf("dead-letter queue holds %v, want the poison message", got)
	}
}

type event struct {
	N int `json:"n"`
}

// TestBadInputParked: a missing ID attribute, an oversized key, a body the
// handler cannot decode and an SNS envelope that is not JSON are each parked
// with a reason, and the receivers keep going with the messages after them.
func TestBadInputParked(t *testing.T) {
	t.Parallel()
	c := client(t)
	e := newE2E(t, fauxqs.NewQueue(t, c, "bad", nil))
	bad := []outgoing{
		{Body: envelope(t, "sns-missing", `{"n":1}`, nil)},
		{Body: envelope(t, "sns-long", `{"n":2}`, map[string]string{"idempotency-key": strings.Repeat("k", 600)})},
		{Body: envelope(t, "sns-malformed", `{"n":`, map[string]string{"idempotency-key": "malformed"})},
		{Body: "this is not an SNS envelope"},
	}
	send(t, c, e.queue, bad)
	var good []outgoing
	var ids []string
	for i := range 30 {
		id := fmt.Sprintf("good-%d", i)
		good = append(good, outgoing{Body: envelope(t, "sns-"+id, fmt.Sprintf(`{"n":%d}`, i), map[string]string{"idempotency-key": id})})
		ids = append(ids, id)
	}
	send(t, c, e.queue, good)

	handler := consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, v event) error {
		return insertEffect(ctx, tx, m)
	})
	src := e.source(sqs.Config{Receivers: 2, SNSEnvelope: true, RequireIDAttribute: true})
	r := consumertest.Start(e.consumer(src, consumer.Config{Handler: handler}))
	e.waitFor("bad input parked, good input applied", 30*time.Second, func() bool {
		return len(e.parked()) == len(bad) && e.drained(len(good))()
	})
	r.Stop(t)

	e.expectOnce(ids)
	reasons := map[string]string{}
	for _, p := range e.parked() {
		switch {
		case strings.Contains(p.LastError, `no "idempotency-key" message attribute`):
			reasons["missing"] = p.Reason
		case strings.Contains(p.LastError, "over the limit"):
			reasons["long"] = p.Reason
		case strings.Contains(p.LastError, "decode payload"):
			reasons["malformed"] = p.Reason
		case strings.Contains(p.LastError, "not an SNS envelope: not JSON"):
			reasons["envelope"] = p.Reason
		default:
			t.Errorf("parked with an unexpected error: %+v", p)
		}
		if p.Attempts != 1 {
			t.Errorf("parked %q after %d attempts; bad input is parked at once", p.LastError, p.Attempts)
		}
	}
	want := map[string]string{
		"missing": parked.ReasonInvalidKey, "long": parked.ReasonInvalidKey,
		"malformed": parked.ReasonPermanent, "envelope": parked.ReasonInvalidKey,
	}
	for k, v := range want {
		if reasons[k] != v {
			t.Errorf("%s: parked with reason %q, want %q (all: %v)", k, reasons[k], v, reasons)
		}
	}
}
