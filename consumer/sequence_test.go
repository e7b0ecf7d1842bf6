package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/jackc/pgx/v5"
)

func seqMsg(sender string, seq int) consumer.Message {
	return consumer.Message{
		Headers: []consumer.Header{{Key: "sender", Value: []byte(sender)}, {Key: "seq", Value: []byte(strconv.Itoa(seq))}},
		ID:      fmt.Sprintf("%s-%d", sender, seq),
		Value:   []byte(fmt.Sprintf("%s-%d", sender, seq)),
	}
}

func seqKey(m *consumer.Message) (dedupe.Key, error) {
	return highwater.HeaderKey(m.Header, "sender", "seq")
}

// A sender's later message must not overtake an earlier one that failed and
// waits for its retry: with a monotonic mark that would turn the earlier one
// into a "duplicate" and lose it; with a strict mark, into a gap. Two
// senders fail in the same batches, so the batch is isolated (savepoints
// per message, or bisection for a BatchHandler) and the rule must hold
// inside that pass too.
func TestSequencedSenderWaitsForItsFailedMessage(t *testing.T) {
	t.Parallel()
	for _, mode := range []highwater.Mode{highwater.Monotonic, highwater.Strict} {
		for _, batchHandler := range []bool{false, true} {
			for _, batch := range []int{12, 1} {
				t.Run(fmt.Sprintf("%s/batchHandler=%v/batch=%d", mode, batchHandler, batch), func(t *testing.T) {
					t.Parallel()
					e := newEnv(t, consumertest.Config{Lanes: 1})
					for seq := 1; seq <= 6; seq++ {
						e.broker.Publish(0, seqMsg("a", seq))
						e.broker.Publish(0, seqMsg("b", seq))
					}
					s, err := highwater.New(highwater.Config{Mode: mode})
					if err != nil {
						t.Fatal(err)
					}
					var mu sync.Mutex
					var order []string
					fail := func(m *consumer.Message) error {
						if (m.ID == "a-2" && m.Attempt <= 2) || (m.ID == "b-3" && m.Attempt == 1) {
							return fmt.Errorf("transient failure of %s", m.ID)
						}
						return nil
					}
					cfg := consumer.Config{Strategy: s, KeyFunc: seqKey, BatchSize: batch, Concurrency: 1, MaxAttempts: 5}
					if batchHandler {
						cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
							for _, m := range msgs {
								if err := fail(m); err != nil {
									return err
								}
							}
							mu.Lock()
							for _, m := range msgs {
								order = append(order, m.ID)
							}
							mu.Unlock()
							return insertEffects(ctx, tx, msgs)
						}
					} else {
						cfg.Handler = func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
							if err := fail(m); err != nil {
								return err
							}
							mu.Lock()
							order = append(order, m.ID)
							mu.Unlock()
							return insertEffect(ctx, tx, m)
						}
					}
					e.runUntilIdle(e.consumer(cfg), 30*time.Second)
					counts := e.effectCounts()
					for _, sender := range []string{"a", "b"} {
						for seq := 1; seq <= 6; seq++ {
							if n := counts[fmt.Sprintf("%s-%d", sender, seq)]; n != 1 {
								t.Errorf("%s-%d applied %d times, want 1", sender, seq, n)
							}
						}
					}
					// Handlers may run again after a rollback; the committed
					// order is what matters: the last run of each message is
					// in its sender's order.
					last := map[string]int{}
					for i, id := range order {
						last[id] = i
					}
					for _, sender := range []string{"a", "b"} {
						for seq := 2; seq <= 6; seq++ {
							if last[fmt.Sprintf("%s-%d", sender, seq)] < last[fmt.Sprintf("%s-%d", sender, seq-1)] {
								t.Errorf("%s-%d applied before %s-%d: %v", sender, seq, sender, seq-1, order)
							}
						}
					}
					if len(e.parked()) != 0 {
						t.Errorf("parked %+v", e.parked())
					}
				})
			}
		}
	}
}

// Deliveries spent waiting on a gap are not failures: a message that waited
// many times for its predecessor still gets its MaxAttempts tries.
func TestWaitingDoesNotCountAsFailing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 2})
	e.broker.Publish(0, seqMsg("a", 2)) // arrives long before a-1
	s, err := highwater.New(highwater.Config{Mode: highwater.Strict})
	if err != nil {
		t.Fatal(err)
	}
	var failedOnce sync.Once
	var failures int
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "a-2" {
			var fail bool
			failedOnce.Do(func() { fail = true; failures++ })
			if fail {
				return errors.New("transient")
			}
		}
		return insertEffect(ctx, tx, m)
	}
	c := e.consumer(consumer.Config{Strategy: s, KeyFunc: seqKey, Handler: h, MaxAttempts: 2, GapMaxAttempts: 1000})
	r := consumertest.Start(c)
	for e.hooks.Total().Gap < 10 {
		time.Sleep(time.Millisecond)
	}
	e.broker.Publish(1, seqMsg("a", 1))
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := e.broker.WaitIdle(wctx); err != nil {
		t.Fatal(err)
	}
	r.Stop(t)
	if got := e.effectCounts(); got["a-1"] != 1 || got["a-2"] != 1 {
		t.Fatalf("effects %v, parked %+v", got, e.parked())
	}
	if failures != 1 {
		t.Fatalf("a-2 failed %d times, want once: the test did not exercise a failure after waiting", failures)
	}
}

// Monotonic marks over ordered lanes, with everything going wrong at once:
// broker duplicates, lost acks, a crash, producer resends and handlers that
// fail now and then. Each sender's messages apply exactly once and in order,
// and the consumer never stalls on a copy that another copy settled.
func TestMonotonicUnderRedelivery(t *testing.T) {
	t.Parallel()
	const senders, perSender = 3, 150
	e := newEnv(t, consumertest.Config{Lanes: senders, DuplicateRate: 0.3, LostAckRate: 0.1, Seed: 9})
	if _, err := e.pool.Exec(context.Background(), `ALTER TABLE effects ADD COLUMN n bigint GENERATED ALWAYS AS IDENTITY`); err != nil {
		t.Fatal(err)
	}
	for seq := 1; seq <= perSender; seq++ {
		for s := range senders {
			m := seqMsg(fmt.Sprintf("s%d", s), seq)
			e.broker.Publish(s, m)
			if seq%7 == 0 {
				e.broker.Publish(s, m) // a producer resend, at the next position
			}
		}
	}
	s, err := highwater.New(highwater.Config{Mode: highwater.Monotonic})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	var order []string
	crashed := false
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		mu.Lock()
		fail := rng.IntN(20) == 0
		crash := !crashed && m.ID == "s1-60"
		if crash {
			crashed = true
		}
		mu.Unlock()
		if crash {
			e.broker.Crash()
		}
		if fail {
			return errors.New("transient")
		}
		if err := insertEffect(ctx, tx, m); err != nil {
			return err
		}
		mu.Lock()
		order = append(order, m.ID)
		mu.Unlock()
		return nil
	}
	e.runUntilIdle(e.consumer(consumer.Config{Strategy: s, KeyFunc: seqKey, Handler: h, BatchSize: 10, MaxAttempts: 1 << 20, GapMaxAttempts: 1 << 20}), time.Minute)
	counts := e.effectCounts()
	for sn := range senders {
		for seq := 1; seq <= perSender; seq++ {
			if n := counts[fmt.Sprintf("s%d-%d", sn, seq)]; n != 1 {
				t.Errorf("s%d-%d applied %d times, want 1", sn, seq, n)
			}
		}
	}
	// The effects table is the committed truth; its insertion order per
	// sender must be the seq order.
	rows, err := e.pool.Query(context.Background(), `SELECT msg_id FROM effects ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	next := map[string]int{}
	for _, id := range ids {
		var sender string
		var seq int
		fmt.Sscanf(strings.Replace(id, "-", " ", 1), "%s %d", &sender, &seq)
		if seq != next[sender]+1 {
			t.Fatalf("%s applied after %s-%d: out of order", id, sender, next[sender])
		}
		next[sender] = seq
	}
}

// A producer copy lets a sender's later message through only when nothing
// between them waits. Seq 1 fails and waits for its retry; then one batch
// brings seq 2 (which must wait behind seq 1), a producer copy of seq 1 (a
// new stored message with the same sender and seq) and seq 3. The copy goes
// first and settles seq 1, but seq 3 must still wait for seq 2, which was put
// on wait in this very batch: with a monotonic mark, applying seq 3 first
// would turn seq 2's redelivery into a duplicate and lose it.
func TestProducerCopyDoesNotLetLaterSeqOvertakeAWaitingOne(t *testing.T) {
	t.Parallel()
	for _, mode := range []highwater.Mode{highwater.Monotonic, highwater.Strict} {
		for _, batchHandler := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/batchHandler=%v", mode, batchHandler), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, consumertest.Config{Lanes: 2})
				e.broker.Publish(0, seqMsg("s", 1))
				e.broker.Publish(1, msg("x", "x")) // keeps the one worker busy while the batch is published
				s, err := highwater.New(highwater.Config{Mode: mode})
				if err != nil {
					t.Fatal(err)
				}
				var firstRef string
				var refMu sync.Mutex
				blocking, release := make(chan struct{}), make(chan struct{})
				var blockOnce sync.Once
				fail := func(m *consumer.Message) error {
					switch m.ID {
					case "s-1":
						refMu.Lock()
						defer refMu.Unlock()
						if firstRef == "" {
							firstRef = m.Ref
						}
						if m.Ref == firstRef && m.Attempt == 1 {
							return errors.New("transient failure of the first copy of s-1")
						}
					case "x":
						blockOnce.Do(func() {
							close(blocking)
							<-release
						})
					}
					return nil
				}
				cfg := consumer.Config{Strategy: s, KeyFunc: highwaterKeyWithSeqIDs, Concurrency: 1, BatchSize: 10, MaxAttempts: 5,
					RetryBackoff: 50 * time.Millisecond, MaxRetryBackoff: 50 * time.Millisecond}
				if batchHandler {
					cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
						for _, m := range msgs {
							if err := fail(m); err != nil {
								return err
							}
						}
						return insertEffects(ctx, tx, msgs)
					}
				} else {
					cfg.Handler = func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
						if err := fail(m); err != nil {
							return err
						}
						return insertEffect(ctx, tx, m)
					}
				}
				r := consumertest.Start(e.consumer(cfg))
				<-blocking
				e.broker.Publish(0, seqMsg("s", 2))
				e.broker.Publish(0, seqMsg("s", 1)) // the producer copy
				e.broker.Publish(0, seqMsg("s", 3))
				close(release)
				wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer wcancel()
				if err := e.broker.WaitIdle(wctx); err != nil {
					t.Fatal(err)
				}
				r.Stop(t)
				counts := e.effectCounts()
				for _, id := range []string{"s-1", "s-2", "s-3", "x"} {
					if counts[id] != 1 {
						t.Errorf("%s applied %d times, want 1 (effects %v, parked %+v)", id, counts[id], counts, e.parked())
					}
				}
			})
		}
	}
}

// highwaterKeyWithSeqIDs is seqKey for messages that also carry a plain ID
// ("x"): those get a sender of their own.
func highwaterKeyWithSeqIDs(m *consumer.Message) (dedupe.Key, error) {
	if _, ok := m.Header("sender"); !ok {
		return dedupe.Key{ID: m.ID, Sender: m.ID, Seq: 1}, nil
	}
	return seqKey(m)
}

// Two stored messages can share a Ref (a lane that restarted its offsets).
// The deliveries one spends waiting must not be taken off the other's
// attempts: a poison message whose later seq waits behind it, under the
// same Ref, still runs out of attempts and is parked, and the later seq
// then applies.
func TestRecurringRefDoesNotLendWaitsToAnotherMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1, RestartOffsetsEvery: 1})
	e.broker.Publish(0, seqMsg("s", 1))
	e.broker.Publish(0, seqMsg("s", 2))
	s, err := highwater.New(highwater.Config{Mode: highwater.Strict})
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "s-1" {
			return errors.New("poison s-1 fails every time")
		}
		return insertEffect(ctx, tx, m)
	}
	e.runUntilIdle(e.consumer(consumer.Config{Strategy: s, KeyFunc: seqKey, Handler: h, BatchSize: 1, Concurrency: 1,
		MaxAttempts: 3, GapMaxAttempts: 100_000}), 30*time.Second)
	rows := e.parked()
	if len(rows) != 1 || string(rows[0].Payload) != "s-1" || rows[0].Reason != parked.ReasonMaxAttempts {
		t.Fatalf("parked %+v, want s-1 alone, out of attempts", rows)
	}
	if n := e.effectCounts()["s-2"]; n != 1 {
		t.Fatalf("s-2 applied %d times, want 1", n)
	}
}
