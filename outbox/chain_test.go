package outbox

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/internal/kafkatest"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	kafkago "github.com/segmentio/kafka-go"
)

// TestChained is the pipeline's invariant: logical inputs, some of them
// sent twice and all of them subject to the test broker's duplicates and
// lost acks, go through stage A (a consumer.Consumer whose handler writes
// an effect and emits a message), the outbox, two relays at once that
// crash between publishing and marking and are started again, Kafka
// (kfake) and stage B (a consumer over sources/kafka), with stage A
// restarted once and stage B twice. Stage B applies
// exactly one effect per logical input, and each key's first deliveries
// reach it in the outbox's commit order. CHAIN_INPUTS sets the size.
// TestChainedKill checks the same invariant with every stage and relay a
// real process killed with SIGKILL, and with poison inputs.
func TestChained(t *testing.T) {
	t.Run("Handler", func(t *testing.T) { testChained(t, false) })
	t.Run("BatchHandler", func(t *testing.T) { testChained(t, true) })
}

func testChained(t *testing.T, batch bool) {
	inputs := 3000
	if s := os.Getenv("CHAIN_INPUTS"); s != "" {
		inputs, _ = strconv.Atoi(s)
	}
	const accounts = 40
	ctx := context.Background()
	db, o := setup(t, Config{Mode: TableMode, Sinks: []string{"balances"}})
	if _, err := db.Exec(ctx, `CREATE TABLE a_effects (input text PRIMARY KEY, serial bigserial, account text, msg_id text);
CREATE TABLE b_effects (serial bigserial, input text, account text, msg_id text, value_null boolean, value_empty boolean)`); err != nil {
		t.Fatal(err)
	}
	k := kafkatest.New(t)
	topic := kafkatest.Name("balances")
	if err := k.CreateTopic(ctx, topic, 4); err != nil {
		t.Fatal(err)
	}

	// Stage A.
	broker := consumertest.New(consumertest.Config{Lanes: 4, DuplicateRate: 0.05, LostAckRate: 0.05})
	strategyA, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	emitted := func(m *consumer.Message, ordinal int) Message {
		input := string(m.Value)
		n, _ := strconv.Atoi(strings.TrimPrefix(input, "in-"))
		var value []byte // nil for every tenth input: a tombstone downstream
		switch n % 10 {
		case 0:
		case 1:
			value = []byte{}
		default:
			value = []byte(input)
		}
		return Message{Sink: "balances", Key: m.Key, Value: value, ID: ID(m, ordinal),
			Headers: []Header{{Key: "input", Value: []byte(input)}}}
	}
	cfgA := consumer.Config{Name: "stage-a", Strategy: strategyA, BatchSize: 100, Logger: consumertest.Logger()}
	if batch {
		// One statement for the effects, one for all the emits.
		cfgA.BatchHandler = func(ctx context.Context, tx pgx.Tx, ms []*consumer.Message) error {
			inputs := make([]string, len(ms))
			accounts := make([]string, len(ms))
			ids := make([]string, len(ms))
			out := make([]Message, len(ms))
			for i, m := range ms {
				inputs[i], accounts[i] = string(m.Value), string(m.Key)
				out[i] = emitted(m, 0)
				ids[i] = out[i].ID
			}
			if err := o.Emit(ctx, tx, out...); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO a_effects (input, account, msg_id)
SELECT input, account, msg_id FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS t(input, account, msg_id, ord)
ORDER BY ord`, inputs, accounts, ids)
			return err
		}
	} else {
		cfgA.Handler = func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			out := emitted(m, 0)
			if err := o.EmitFor(ctx, tx, m, out); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO a_effects (input, account, msg_id) VALUES ($1, $2, $3)`, string(m.Value), string(m.Key), out.ID)
			return err
		}
	}
	stageA := consumertest.NewConsumer(t, db, broker, cfgA)
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
	runA := consumertest.Start(stageA)

	// Two relay slots; each relay crashes (after a publish, before its
	// marks) on a pass of its choosing, for the first few incarnations.
	w := k.Writer(topic)
	w.Balancer = &kafkago.Hash{}
	defer w.Close()
	sink, err := NewKafkaSink(w)
	if err != nil {
		t.Fatal(err)
	}
	relays := startRelaySlots(t, ctx, db, sink)
	defer relays.stop()

	// Stage B, restarted twice while it runs.
	group := kafkatest.Name("stage-b")
	strategyB, err := idset.New(idset.Config{Table: "processed_b"})
	if err != nil {
		t.Fatal(err)
	}
	counterB := &consumertest.Counter{}
	startB := func() (*consumertest.Running, *kafka.Source) {
		src, err := kafka.New(db, kafka.Config{
			Brokers: k.Brokers(), Group: group, Topics: []string{topic},
			MaxWait: kafkatest.MaxWait, SessionTimeout: kafkatest.SessionTimeout,
			HeartbeatInterval: kafkatest.HeartbeatInterval, RebalanceTimeout: 5 * time.Second,
			JoinGroupBackoff: 200 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		c := consumertest.NewConsumer(t, db, src, consumer.Config{
			Name: "stage-b", Strategy: strategyB, BatchSize: 200, Hooks: []consumer.Hook{counterB},
			Logger: consumertest.Logger(),
			Handler: func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				input, _ := m.Header("input")
				_, err := tx.Exec(ctx, `INSERT INTO b_effects (input, account, msg_id, value_null, value_empty) VALUES ($1, $2, $3, $4, $5)`,
					string(input), string(m.Key), m.ID, m.Value == nil, m.Value != nil && len(m.Value) == 0)
				return err
			},
		})
		return consumertest.Start(c), src
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

	checkChain(t, db, inputs, chainChecks{})
	t.Logf("chain: %d inputs (%d sent twice), stage A broker %+v; relays: %d incarnations, %d crashes before marking, %d stops mid-pass; stage A: 1 restart; stage B: %d restarts, %s",
		inputs, logicalDupes, broker.Stats(), relays.incarnations.Load(), relays.crashes.Load(), relays.stops.Load(), restartsB, counterB)
	if relays.crashes.Load() == 0 {
		t.Fatal("no relay crashed: the test did not test what it says")
	}
}

// chainChecks turns off what checkChain checks by default.
type chainChecks struct {
	noNulls bool // the sink cannot carry nil and empty values: none were emitted
	noOrder bool // the sink keeps no order (an SQS standard queue)
}

func checkChain(t *testing.T, db *pgxpool.Pool, inputs int, skip chainChecks) {
	t.Helper()
	ctx := context.Background()
	var total, distinct, badNull, badEmpty, aCount, nulls, empties int
	if err := db.QueryRow(ctx, `SELECT count(*), count(DISTINCT input),
    count(*) FILTER (WHERE value_null <> (substring(input from 4)::int % 10 = 0)),
    count(*) FILTER (WHERE value_empty <> (substring(input from 4)::int % 10 = 1)),
    (SELECT count(*) FROM a_effects), count(*) FILTER (WHERE value_null), count(*) FILTER (WHERE value_empty)
FROM b_effects`).Scan(&total, &distinct, &badNull, &badEmpty, &aCount, &nulls, &empties); err != nil {
		t.Fatal(err)
	}
	if total != inputs || distinct != inputs || aCount != inputs {
		t.Fatalf("stage B applied %d effects for %d distinct inputs (stage A %d), want exactly one each of %d", total, distinct, aCount, inputs)
	}
	if skip.noNulls { // every value was the input's name
		badNull, badEmpty = nulls, empties
	}
	if badNull != 0 || badEmpty != 0 {
		t.Fatalf("%d null and %d empty values arrived wrong", badNull, badEmpty)
	}
	if skip.noOrder {
		return
	}
	// Per key, stage B's applications (its first deliveries) in stage A's
	// commit order. Stage A records each emit in a_effects after Emit took
	// the key's counter row, which it holds until its commit, so a_effects'
	// serial orders a key's emits as they commit. (The outbox's seq does
	// not across a relay's cleanup: a key with nothing waiting loses its
	// counter and starts again at 1.)
	orderOf := func(q string) map[string][]string {
		out := map[string][]string{}
		rows, err := db.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var k, id string
			if err := rows.Scan(&k, &id); err != nil {
				t.Fatal(err)
			}
			out[k] = append(out[k], id)
		}
		return out
	}
	committed := orderOf(`SELECT account, msg_id FROM a_effects ORDER BY serial`)
	applied := orderOf(`SELECT account, msg_id FROM b_effects ORDER BY serial`)
	for k, want := range committed {
		if strings.Join(applied[k], ",") != strings.Join(want, ",") {
			t.Fatalf("key %s: stage B applied %d messages in an order other than the %d committed", k, len(applied[k]), len(want))
		}
	}
}

// relaySlots are the chained tests' two relay slots. In each, a relay
// crashes (after a publish, before its marks) on a pass of its choosing
// for its first three incarnations, the fourth stops gracefully in
// mid-pass, and later ones run until stop.
type relaySlots struct {
	crashes, stops, incarnations atomic.Int64
	stop                         func() // stops the relays and waits for them
}

func startRelaySlots(t *testing.T, ctx context.Context, db *pgxpool.Pool, sink Sink) *relaySlots {
	s := &relaySlots{}
	relayCtx, stopRelays := context.WithCancel(ctx)
	var relays sync.WaitGroup
	for slot := range 2 {
		relays.Add(1)
		go func() {
			defer relays.Done()
			for life := 0; relayCtx.Err() == nil; life++ {
				s.incarnations.Add(1)
				var passes atomic.Int64
				crashAt, stopAt := int64(-1), int64(-1)
				switch {
				case life < 3:
					crashAt = int64(2 + (slot+life)%3)
				case life == 3:
					stopAt = 2
				}
				lifeCtx, stopLife := context.WithCancel(relayCtx)
				r, err := NewRelay(db, RelayConfig{Sinks: map[string]Sink{"balances": sink}, LeaseTTL: time.Second,
					BatchSize: 200, PollInterval: 200 * time.Millisecond, Logger: consumertest.Logger(),
					afterPublish: func([]row) error {
						switch passes.Add(1) {
						case crashAt:
							s.crashes.Add(1)
							return errCrash
						case stopAt:
							s.stops.Add(1)
							stopLife() // a graceful stop in mid-pass: what was published is marked
						}
						return nil
					}})
				if err != nil {
					stopLife()
					t.Error(err)
					return
				}
				err = r.Run(lifeCtx)
				stopLife()
				if err != nil && err != errCrash {
					t.Error(err)
					return
				}
			}
		}()
	}
	s.stop = func() { stopRelays(); relays.Wait() }
	return s
}
