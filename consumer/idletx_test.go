package consumer_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/jackc/pgx/v5"
)

// A worker frozen in the middle of a batch (stopped, a long GC pause)
// holds its transaction open, and with it the markers it claimed. When the
// message is delivered to another worker meanwhile (a Kafka partition
// handed over, an SQS visibility timeout that ran out), that worker's
// claim of the same key waits for the frozen transaction, for as long as
// the freeze lasts. IdleTxTimeout bounds it: the server ends the frozen
// session, its claims roll back, and the other worker applies the message.
// When the frozen worker wakes, its batch fails and its redelivery is a
// duplicate: one effect.
func TestFrozenWorkerReleasesItsClaims(t *testing.T) {
	e := newEnv(t, consumertest.Config{Lanes: 1})
	other := consumertest.New(consumertest.Config{Lanes: 1})
	e.broker.Publish(0, msg("m1", "p1"))
	other.Publish(0, msg("m1", "p1"))

	frozen := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	thaw := func() { once.Do(func() { close(release) }) }
	defer thaw()
	var first sync.Once
	freezing := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := insertEffect(ctx, tx, m); err != nil {
			return err
		}
		froze := false
		first.Do(func() { froze = true })
		if froze {
			close(frozen)
			<-release // idle in the transaction, as a stopped process is
		}
		return nil
	}
	idle := 300 * time.Millisecond
	a := consumertest.Start(e.consumer(consumer.Config{Name: "a", Scope: "ledger", Handler: freezing, IdleTxTimeout: idle}))
	select {
	case <-frozen:
	case <-time.After(time.Minute):
		t.Fatal("the first worker never ran its handler")
	}

	b := consumertest.NewConsumer(t, e.pool, other, e.config(consumer.Config{Name: "b", Scope: "ledger", IdleTxTimeout: idle}))
	consumertest.RunUntilIdle(t, b, other, time.Minute)
	if n := e.effectCounts()["m1"]; n != 1 {
		t.Fatalf("m1 has %d effects while the first worker is frozen, want 1 (the other worker's)", n)
	}

	thaw()
	if err := e.broker.WaitIdle(ctxTimeout(t, time.Minute)); err != nil {
		t.Fatalf("the thawed worker did not settle its batch: %v", err)
	}
	a.Stop(t)
	if n := e.effectCounts()["m1"]; n != 1 {
		t.Fatalf("m1 has %d effects, want 1", n)
	}
	if tot := e.hooks.Total(); tot.Applied != 1 || tot.Duplicate != 1 {
		t.Errorf("outcomes %s, want 1 applied (the other worker) and 1 duplicate (the thawed one)", e.hooks)
	}
}

// A handler that keeps its transaction idle for longer than IdleTxTimeout
// fails, and the failure counts as an attempt: the message is parked after
// MaxAttempts, not retried for ever as a lost connection would be.
func TestIdleHandlerCountsAttempts(t *testing.T) {
	e := newEnv(t, consumertest.Config{Lanes: 1})
	e.broker.Publish(0, msg("slow", "p"))
	slow := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
			return err
		}
		time.Sleep(400 * time.Millisecond) // waits on something else, inside the transaction
		return insertEffect(ctx, tx, m)
	}
	c := e.consumer(consumer.Config{Handler: slow, IdleTxTimeout: 100 * time.Millisecond, MaxAttempts: 2})
	e.runUntilIdle(c, time.Minute)
	parked := e.parked()
	if len(parked) != 1 || parked[0].Reason != "max_attempts" {
		t.Fatalf("parked %+v, want the slow message parked after its attempts", parked)
	}
	if n := e.effectCounts()["slow"]; n != 0 {
		t.Fatalf("%d effects of the parked message", n)
	}
}

// The setting is for the batch transaction only.
func TestIdleTxTimeoutIsLocal(t *testing.T) {
	e := newEnv(t, consumertest.Config{Lanes: 1})
	e.broker.Publish(0, msg("m", "p"))
	var inTx string
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := tx.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&inTx); err != nil {
			return err
		}
		return insertEffect(ctx, tx, m)
	}
	e.runUntilIdle(e.consumer(consumer.Config{Handler: h, IdleTxTimeout: 1500 * time.Millisecond}), time.Minute)
	if inTx != "1500ms" {
		t.Errorf("in the batch transaction: %q, want 1500ms", inTx)
	}
	var after string
	if err := e.pool.QueryRow(context.Background(), `SHOW idle_in_transaction_session_timeout`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != "0" {
		t.Errorf("outside it: %q, want the server's 0", after)
	}
	if _, err := consumer.New(e.pool, e.broker, e.config(consumer.Config{IdleTxTimeout: time.Microsecond})); !errors.Is(err, consumer.ErrInvalidConfig) {
		t.Errorf("IdleTxTimeout of 1µs: %v, want a config error", err)
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// A handler whose transaction stays idle for longer than IdleTxTimeout
// after its last statement returns without an error, and the server has
// ended the session by the time the engine commits. That counts as the
// handler's failed attempt too: the message is parked after MaxAttempts,
// not delivered again for ever as an unknown outcome.
//
// For a BatchHandler the slow call is the whole call's: every message in
// it counts the failed attempt. Whether a and b share their next call is
// up to the source: each retried message has its own jittered delay, and a
// due before b is delivered (and applied) alone. The source here hands a
// batch's retries back together, as one visibility change does, so that
// both are called together again and both are parked.
func TestIdleAfterTheLastStatementCountsAttempts(t *testing.T) {
	for _, shape := range []string{"Handler", "BatchHandler"} {
		t.Run(shape, func(t *testing.T) {
			e := newEnv(t, consumertest.Config{Lanes: 1})
			var calls [][]string // a BatchHandler's calls, by message ID
			var mu sync.Mutex
			e.broker.Publish(0, msg("a", "p"))
			e.broker.Publish(0, msg("b", "p"))
			pause := func() { time.Sleep(400 * time.Millisecond) } // waits on something else, inside the transaction
			cfg := consumer.Config{IdleTxTimeout: 100 * time.Millisecond, MaxAttempts: 2, BatchSize: 2}
			if shape == "Handler" {
				cfg.Handler = func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					if err := insertEffect(ctx, tx, m); err != nil {
						return err
					}
					if m.ID == "b" {
						pause()
					}
					return nil
				}
			} else {
				cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
					var ids []string
					for _, m := range msgs {
						ids = append(ids, m.ID)
					}
					mu.Lock()
					calls = append(calls, ids)
					mu.Unlock()
					if err := insertEffects(ctx, tx, msgs); err != nil {
						return err
					}
					for _, m := range msgs {
						if m.ID == "b" {
							pause()
						}
					}
					return nil
				}
			}
			c := consumertest.NewConsumer(t, e.pool, retriesTogether{e.broker}, e.config(cfg))
			e.runUntilIdle(c, time.Minute)
			if shape == "BatchHandler" {
				// One failing call per attempt, each with both messages.
				if len(calls) != cfg.MaxAttempts || slices.ContainsFunc(calls, func(c []string) bool { return strings.Join(c, ",") != "a,b" }) {
					t.Errorf("BatchHandler calls %v: want %d, each with a and b", calls, cfg.MaxAttempts)
				}
			}
			counts := e.effectCounts()
			parked := map[string]string{}
			for _, p := range e.parked() {
				parked[string(p.Payload)+"/"+p.Ref] = p.Reason
				if p.Reason != "max_attempts" || !strings.Contains(p.LastError, "IdleTxTimeout") {
					t.Errorf("parked %v: want max_attempts, with an error naming IdleTxTimeout", p)
				}
			}
			// A Handler's slow call is its own message's; a BatchHandler's
			// is the whole call's, so both of its messages are parked.
			wantParked, wantA := 1, 1
			if shape == "BatchHandler" {
				wantParked, wantA = 2, 0
			}
			if len(parked) != wantParked || counts["b"] != 0 || counts["a"] != wantA {
				t.Fatalf("parked %v, effects %v: want %d parked and a applied %d times", parked, counts, wantParked, wantA)
			}
		})
	}
}

// retriesTogether is a source that hands a batch's retried messages back
// together, after the longest of their delays.
type retriesTogether struct{ consumer.Source }

func (s retriesTogether) Settle(ctx context.Context, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	var d time.Duration
	for _, r := range retry {
		d = max(d, r.Delay)
	}
	together := make([]consumer.Retry, len(retry))
	for i, r := range retry {
		together[i] = consumer.Retry{Message: r.Message, Delay: d}
	}
	return s.Source.Settle(ctx, b, ack, together)
}
