package outbox

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/fauxqs"
	"github.com/effectively-once/effectively/sources/sqs"
	"github.com/jackc/pgx/v5"
)

// TestChainedSQS is TestChained's invariant through SQS (fauxqs): stage A
// (a consumer.Consumer over the test broker, with duplicate inputs and lost
// acks, restarted once) emits one message per input, two relays at once
// crash between publishing and marking (or stop in mid-pass) and are
// started again, an SQSSink sends to the queue, and stage B, a consumer
// over sources/sqs restarted twice, applies exactly one effect per logical
// input, its value and headers byte for byte what stage A emitted. On a FIFO queue (key =
// MessageGroupId) each key's first deliveries reach stage B in the
// outbox's commit order; a standard queue orders nothing, so only the
// exactly-once part is checked there. SQS bodies cannot be nil or empty, so
// every value here is text. The emulator, like SQS, drops a FIFO
// deduplication ID seen in the last five minutes, so stage B sees the
// relays' duplicates only on the standard queue. CHAIN_SQS_INPUTS sets the
// size.
func TestChainedSQS(t *testing.T) {
	t.Run("standard", func(t *testing.T) { testChainedSQS(t, false) })
	t.Run("FIFO", func(t *testing.T) { testChainedSQS(t, true) })
}

func testChainedSQS(t *testing.T, fifo bool) {
	inputs := 4000
	if s := os.Getenv("CHAIN_SQS_INPUTS"); s != "" {
		inputs, _ = strconv.Atoi(s)
	}
	const accounts = 40
	ctx := context.Background()
	db, o := setup(t, Config{Mode: TableMode, Sinks: []string{"balances"}})
	if _, err := db.Exec(ctx, `CREATE TABLE a_effects (input text PRIMARY KEY, serial bigserial, account text, msg_id text);
CREATE TABLE b_effects (serial bigserial, input text, account text, msg_id text, value_null boolean, value_empty boolean)`); err != nil {
		t.Fatal(err)
	}
	c := fauxqs.Client(t)
	name := "balances"
	if fifo {
		name += ".fifo"
	}
	queue := fauxqs.NewQueue(t, c, name, nil)

	// Stage A.
	broker := consumertest.New(consumertest.Config{Lanes: 4, DuplicateRate: 0.05, LostAckRate: 0.05})
	strategyA, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	value := func(input string) []byte { return []byte("value of " + input + " ✓") }
	cfgA := consumer.Config{Name: "stage-a", Strategy: strategyA, BatchSize: 100, Logger: consumertest.Logger(),
		Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			input := string(m.Value)
			if err := o.EmitFor(ctx, tx, m, Message{Sink: "balances", Key: m.Key, Value: value(input), ID: ID(m, 0),
				Headers: []Header{{Key: "input", Value: []byte(input)}, {Key: "account", Value: m.Key},
					{Key: "raw", Value: []byte{0, 0xff, byte(len(input))}}}}); err != nil {
				return err
			}
			// After the emit, which holds the key's counter row until the
			// commit: serial is the key's commit order (see checkChain).
			_, err := tx.Exec(ctx, `INSERT INTO a_effects (input, account, msg_id) VALUES ($1, $2, $3)`, input, string(m.Key), ID(m, 0))
			return err
		}}
	runA := consumertest.Start(consumertest.NewConsumer(t, db, broker, cfgA))
	logicalDupes := 0
	for i := range inputs {
		acct := fmt.Sprintf("acct-%d", i%accounts)
		in := consumer.Message{ID: fmt.Sprintf("in-%d", i), Key: []byte(acct), Value: []byte(fmt.Sprintf("in-%d", i))}
		broker.Publish(i%accounts, in)
		if i%17 == 0 { // a producer's retry: the same logical input again
			broker.Publish(i%accounts, in)
			logicalDupes++
		}
	}

	// Two relay slots; each relay crashes (after a publish, before its
	// marks) on a pass of its choosing, for the first few incarnations.
	sink, err := NewSQSSink(c, queue)
	if err != nil {
		t.Fatal(err)
	}
	relays := startRelaySlots(t, ctx, db, sink)
	defer relays.stop()

	// Stage B, restarted twice while it runs.
	strategyB, err := idset.New(idset.Config{Table: "processed_b"})
	if err != nil {
		t.Fatal(err)
	}
	counterB := &consumertest.Counter{}
	var wrong atomic.Int64 // deliveries whose value or headers are not what stage A emitted
	startB := func() (*consumertest.Running, *sqs.Source) {
		src, err := sqs.New(ctx, sqs.Config{QueueURL: queue, Client: c, Receivers: 2, WaitTime: time.Second,
			VisibilityTimeout: 2 * time.Second, HeartbeatInterval: 500 * time.Millisecond, Logger: consumertest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		cb := consumertest.NewConsumer(t, db, src, consumer.Config{
			Name: "stage-b", Strategy: strategyB, BatchSize: 200, Hooks: []consumer.Hook{counterB},
			KeyFunc: sqs.ParkUnreadable(nil), Logger: consumertest.Logger(),
			Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				input, _ := m.Header("input")
				account, _ := m.Header("account")
				raw, _ := m.Header("raw")
				if !bytes.Equal(m.Value, value(string(input))) || !bytes.Equal(raw, []byte{0, 0xff, byte(len(input))}) ||
					(fifo && !bytes.Equal(m.Key, account)) {
					wrong.Add(1)
				}
				_, err := tx.Exec(ctx, `INSERT INTO b_effects (input, account, msg_id, value_null, value_empty) VALUES ($1, $2, $3, $4, $5)`,
					string(input), string(account), m.ID, m.Value == nil, m.Value != nil && len(m.Value) == 0)
				return err
			},
		})
		return consumertest.Start(cb), src
	}
	runB, src := startB()
	restartsB := 0
	for _, at := range []int{inputs / 3, 2 * inputs / 3} {
		waitAtLeast(t, db, 2*time.Minute, at, `SELECT count(DISTINCT input) FROM b_effects`)
		runB.Stop(t)
		_ = src.Close()
		runB, src = startB()
		restartsB++
	}
	defer func() { _ = src.Close() }()

	// Stage A, stopped and started again once it has applied half.
	waitAtLeast(t, db, 2*time.Minute, inputs/2, `SELECT count(*) FROM a_effects`)
	runA.Stop(t)
	runA = consumertest.Start(consumertest.NewConsumer(t, db, broker, cfgA))

	waitRows(t, db, 2*time.Minute, inputs, `SELECT count(DISTINCT input) FROM b_effects`)
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	if err := broker.WaitIdle(waitCtx); err != nil {
		t.Fatal(err)
	}
	cancel()
	runA.Stop(t)
	waitRows(t, db, time.Minute, 0, `SELECT count(*) FROM effectively.outbox WHERE published_at IS NULL`)
	relays.stop()
	runB.Stop(t)

	checkChain(t, db, inputs, chainChecks{noNulls: true, noOrder: !fifo})
	if n := wrong.Load(); n != 0 {
		t.Fatalf("%d deliveries at stage B did not carry what stage A emitted", n)
	}
	if parked := consumertest.Parked(t, db, "", ""); len(parked) != 0 {
		t.Fatalf("%d messages parked, want none: first %+v", len(parked), parked[0])
	}
	t.Logf("chain (SQS, fifo %v): %d inputs (%d sent twice), stage A broker %+v; relays: %d incarnations, %d crashes before marking, %d stops mid-pass; stage A: 1 restart; stage B: %d restarts, %s",
		fifo, inputs, logicalDupes, broker.Stats(), relays.incarnations.Load(), relays.crashes.Load(), relays.stops.Load(), restartsB, counterB)
	if relays.crashes.Load() == 0 {
		t.Fatal("no relay crashed: the test did not test what it says")
	}
}
