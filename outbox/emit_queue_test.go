package outbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/jackc/pgx/v5"
)

// TestQueueHandlerEmits: a QueueHandler stage emits through EmitQueued
// under redelivery (duplicate deliveries, lost acknowledgements, a
// producer's retries), beside an input whose queued statement fails and
// one whose handler fails after emitting. Every applied input leaves
// exactly one outbox row per emit, with the IDs derived from the input;
// the failed inputs leave none. The relay of the outbox's mode (the log
// relay for LogMode, the table relay for TableMode) publishes them all,
// per key in commit order.
func TestQueueHandlerEmits(t *testing.T) {
	for _, mode := range []Mode{LogMode, TableMode} {
		t.Run(mode.String(), func(t *testing.T) { testQueueHandlerEmits(t, mode) })
	}
}

func testQueueHandlerEmits(t *testing.T, mode Mode) {
	const inputs, keys, scope = 400, 8, "stage-q"
	ctx := context.Background()
	db, o := setup(t, Config{Mode: mode, Sinks: []string{"s"}})
	if _, err := db.Exec(ctx, `CREATE TABLE q_effects (serial bigserial, input text PRIMARY KEY CHECK (input <> 'in-poison'), key text)`); err != nil {
		t.Fatal(err)
	}
	sink := newMemSink()
	if mode == LogMode {
		r, _ := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}, BatchSize: 50})
		waitActive(t, r)
	} else {
		startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, BatchSize: 50})
	}

	// Input i emits 1 + i%3 messages; it is in lane i%keys, as its key.
	emits := func(in string) int {
		var i int
		fmt.Sscanf(in, "in-%d", &i)
		return 1 + i%3
	}
	broker := consumertest.New(consumertest.Config{Lanes: keys, DuplicateRate: 0.1, LostAckRate: 0.1})
	publish := func(i int, id string) {
		broker.Publish(i%keys, consumer.Message{ID: id, Key: []byte(fmt.Sprint("k", i%keys)), Value: []byte(id)})
	}
	for i := range inputs {
		publish(i, fmt.Sprint("in-", i))
		if i%13 == 0 {
			publish(i, fmt.Sprint("in-", i)) // a producer's retry
		}
	}
	publish(3, "in-poison")  // its INSERT fails: retried, then parked
	publish(5, "in-refused") // its handler fails after emitting: parked
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := consumertest.NewConsumer(t, db, broker, consumer.Config{Name: scope, Strategy: strategy, BatchSize: 25,
		MaxAttempts: 2, RetryBackoff: 10 * time.Millisecond, Logger: consumertest.Logger(),
		QueueHandler: func(ctx context.Context, q consumer.Queue, m *consumer.Message) error {
			q.Queue(`INSERT INTO q_effects (input, key) VALUES ($1, $2)`, string(m.Value), string(m.Key))
			out := make([]Message, emits(string(m.Value)))
			for j := range out {
				out[j] = Message{Sink: "s", Key: m.Key, Value: fmt.Appendf(nil, "%s/%d", m.Value, j)}
			}
			if err := o.EmitQueued(q, m, out...); err != nil {
				return err
			}
			if string(m.Value) == "in-refused" {
				return consumer.Permanent(errors.New("refused after emitting"))
			}
			return nil
		}})
	consumertest.RunUntilIdle(t, c, broker, 2*time.Minute)
	if broker.Redelivered() == 0 {
		t.Fatal("nothing was redelivered: the test tests nothing")
	}

	// The IDs each input's emits must carry, per key in commit order (the
	// effects' serial: a key is one lane, whose batches commit in turn).
	idOf := func(input string, j int) string {
		return ID(&consumer.Message{DedupeKey: dedupe.Key{Scope: scope, ID: input}}, j)
	}
	want := map[string][]string{}
	var all []string
	rows, err := db.Query(ctx, `SELECT input, key FROM q_effects ORDER BY serial`)
	if err != nil {
		t.Fatal(err)
	}
	applied := 0
	for rows.Next() {
		var input, key string
		if err := rows.Scan(&input, &key); err != nil {
			t.Fatal(err)
		}
		applied++
		for j := range emits(input) {
			want[key] = append(want[key], idOf(input, j))
			all = append(all, idOf(input, j))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if applied != inputs {
		t.Fatalf("%d inputs applied, want %d", applied, inputs)
	}
	got := ids(emitted(t, db))
	slices.Sort(got)
	wantSorted := slices.Sorted(slices.Values(all))
	if !slices.Equal(got, wantSorted) {
		t.Fatalf("the outbox holds %d rows, want exactly one per emit of an applied input (%d)", len(got), len(all))
	}
	for _, in := range []string{"in-poison", "in-refused"} {
		for j := range 3 {
			if slices.Contains(got, idOf(in, j)) {
				t.Fatalf("%s, which failed, emitted %s", in, idOf(in, j))
			}
		}
	}

	published := sink.waitFor(t, 2*time.Minute, "every emitted message", hasIDs(all...))
	first := firstOrder(published)
	for key, ids := range want {
		if g := first[key]; !slices.Equal(g, ids) {
			t.Fatalf("key %s: first deliveries\n%s\nwant commit order\n%s", key, strings.Join(g, ","), strings.Join(ids, ","))
		}
	}
}

// TestQueuedEmitsAreOneStatement: the emits a batch's QueueHandlers
// queue are written by one INSERT (every row of the batch's transaction
// has the same command ID), after the batch's other statements; and
// EmitQueued refuses a bad message without queueing anything.
func TestQueuedEmitsAreOneStatement(t *testing.T) {
	ctx := context.Background()
	db, o := setup(t, Config{})
	if _, err := db.Exec(ctx, `CREATE TABLE q_effects (input text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	var b pgx.Batch
	var me *MessageError
	if err := o.EmitQueued(&b, &consumer.Message{}, Message{Sink: "s"}, Message{Sink: ""}); !errors.As(err, &me) || me.Index != 1 || b.Len() != 0 {
		t.Fatalf("EmitQueued of an empty sink: %v, %d statements queued", err, b.Len())
	}

	const n = 50
	broker := consumertest.New(consumertest.Config{Lanes: 1})
	for i := range n {
		id := fmt.Sprint("in-", i)
		broker.Publish(0, consumer.Message{ID: id, Key: []byte(fmt.Sprint("k", i%7)), Value: []byte(id)})
	}
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	counter := &consumertest.Counter{}
	c := consumertest.NewConsumer(t, db, broker, consumer.Config{Name: "one", Strategy: strategy, BatchSize: n,
		Logger: consumertest.Logger(), Hooks: []consumer.Hook{counter},
		QueueHandler: func(ctx context.Context, q consumer.Queue, m *consumer.Message) error {
			if err := o.EmitQueued(q, m, Message{Sink: "s", Key: m.Key, Value: m.Value}); err != nil {
				return err
			}
			q.Queue(`INSERT INTO q_effects (input) VALUES ($1)`, string(m.Value))
			return nil
		}})
	consumertest.RunUntilIdle(t, c, broker, 2*time.Minute)
	if tot := counter.Total(); tot.Batches != 1 || tot.Applied != n {
		t.Fatalf("want one batch of %d applied, got %s", n, tot)
	}
	// A LogMode emit is one row of the log table, holding its messages.
	var rows, msgs, xacts, commands int
	var afterEffects bool
	if err := db.QueryRow(ctx, `SELECT count(*), coalesce(sum(n), 0), count(DISTINCT xmin::text), count(DISTINCT cmin::text),
    min(cmin::text::int) > (SELECT max(cmin::text::int) FROM q_effects)
FROM effectively.outbox_log`).Scan(&rows, &msgs, &xacts, &commands, &afterEffects); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || msgs != n || len(emitted(t, db)) != n || xacts != 1 || commands != 1 || !afterEffects {
		t.Fatalf("%d log rows of %d messages in %d transactions by %d statements (after the effects: %v); want one row of %d messages, after the effects",
			rows, msgs, xacts, commands, afterEffects, n)
	}
}

// TestQueuedEmitBlamesItsMessage: when the batch's one INSERT of emits
// fails for one message's row, the batch runs again with each message's
// emit on its own: that message alone is parked, with nothing emitted,
// and the others commit with their emits, once each.
func TestQueuedEmitBlamesItsMessage(t *testing.T) {
	ctx := context.Background()
	db, o := setup(t, Config{})
	if _, err := db.Exec(ctx, `CREATE TABLE q_effects (input text PRIMARY KEY);
-- in-7's value in a log row's body: its length plus one (5), then 'in-7'.
ALTER TABLE effectively.outbox_log ADD CONSTRAINT no_bad CHECK (position('\x05696e2d37'::bytea IN body) = 0)`); err != nil {
		t.Fatal(err)
	}
	const n = 20
	broker := consumertest.New(consumertest.Config{Lanes: 1})
	for i := range n {
		id := fmt.Sprint("in-", i)
		broker.Publish(0, consumer.Message{ID: id, Key: []byte("k"), Value: []byte(id)})
	}
	strategy, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := consumertest.NewConsumer(t, db, broker, consumer.Config{Name: "blame", Strategy: strategy, BatchSize: n,
		MaxAttempts: 1, Logger: consumertest.Logger(),
		QueueHandler: func(ctx context.Context, q consumer.Queue, m *consumer.Message) error {
			q.Queue(`INSERT INTO q_effects (input) VALUES ($1)`, string(m.Value))
			return o.EmitQueued(q, m, Message{Sink: "s", Key: m.Key, Value: m.Value})
		}})
	consumertest.RunUntilIdle(t, c, broker, 2*time.Minute)
	var effects int
	var bad bool
	if err := db.QueryRow(ctx, `SELECT count(*), EXISTS (SELECT 1 FROM q_effects WHERE input = 'in-7')
FROM q_effects`).Scan(&effects, &bad); err != nil {
		t.Fatal(err)
	}
	got := ids(emitted(t, db))
	distinct := len(slices.Compact(slices.Sorted(slices.Values(got))))
	if effects != n-1 || len(got) != n-1 || distinct != n-1 || bad {
		t.Fatalf("%d effects and %d emits (%d distinct), in-7 applied: %v; want %d each, in-7 parked", effects, len(got), distinct, bad, n-1)
	}
}
