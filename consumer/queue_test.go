package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func queueEffect(_ context.Context, q consumer.Queue, m *consumer.Message) error {
	q.Queue(`INSERT INTO effects (msg_id, lane, payload) VALUES ($1, $2, $3)`, m.ID, m.Lane, m.Value)
	return nil
}

// TestConfigHandlerShapes: exactly one of the three handler shapes.
func TestConfigHandlerShapes(t *testing.T) {
	t.Parallel()
	s, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	broker := consumertest.New(consumertest.Config{})
	for _, tc := range []struct {
		name string
		cfg  consumer.Config
		ok   bool
	}{
		{"none", consumer.Config{}, false},
		{"Handler", consumer.Config{Handler: insertEffect}, true},
		{"QueueHandler", consumer.Config{QueueHandler: queueEffect}, true},
		{"BatchHandler", consumer.Config{BatchHandler: insertEffects}, true},
		{"Handler+QueueHandler", consumer.Config{Handler: insertEffect, QueueHandler: queueEffect}, false},
		{"QueueHandler+BatchHandler", consumer.Config{QueueHandler: queueEffect, BatchHandler: insertEffects}, false},
		{"all three", consumer.Config{Handler: insertEffect, QueueHandler: queueEffect, BatchHandler: insertEffects}, false},
	} {
		cfg := tc.cfg
		cfg.Name, cfg.Strategy = "x", s
		_, err := consumer.New(noDB{}, broker, cfg)
		var ce *consumer.ConfigError
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: New = %v", tc.name, err)
		case !tc.ok && (!errors.As(err, &ce) || ce.Field != "Handler" || !strings.Contains(err.Error(), "QueueHandler")):
			t.Errorf("%s: New = %v, want a ConfigError for Handler naming the three shapes", tc.name, err)
		}
	}
}

// TestQueueFailureIsolation: a message whose queued statement fails is
// retried and then parked alone; its batch-mates commit in the same batch;
// none of the failing message's statements land, not even those queued
// before the failing one; no batch-mate is blamed.
func TestQueueFailureIsolation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	if _, err := e.pool.Exec(context.Background(), `CREATE TABLE side (msg_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const n = 40
	bad := map[string]bool{"m-3": true, "m-17": true, "m-18": true, "m-39": true}
	var mu sync.Mutex
	calls := map[string]int{}
	h := func(ctx context.Context, q consumer.Queue, m *consumer.Message) error {
		mu.Lock()
		calls[m.ID]++
		mu.Unlock()
		q.Queue(`INSERT INTO side (msg_id) VALUES ($1)`, m.ID)
		if bad[m.ID] {
			q.Queue(`SELECT 1 / 0`) // division_by_zero: fails every time
		}
		q.Queue(`INSERT INTO effects (msg_id, lane, payload) VALUES ($1, $2, $3)`, m.ID, m.Lane, m.Value)
		return nil
	}
	for i := range n {
		id := fmt.Sprintf("m-%d", i)
		e.broker.Publish(0, msg(id, id))
	}
	e.runUntilIdle(e.consumer(consumer.Config{QueueHandler: h, BatchSize: n, MaxAttempts: 2}), 30*time.Second)

	parkedRows := e.parked()
	if len(parkedRows) != len(bad) {
		t.Fatalf("parked %d, want %d: %+v", len(parkedRows), len(bad), parkedRows)
	}
	for _, p := range parkedRows {
		if !bad[*p.DedupeID] || p.Reason != parked.ReasonMaxAttempts || !strings.Contains(p.LastError, "division by zero") || !strings.Contains(p.LastError, "SELECT 1 / 0") {
			t.Errorf("parked %s (%s): %s", *p.DedupeID, p.Reason, p.LastError)
		}
	}
	effects := e.effectCounts()
	side := consumertest.EffectCounts(t, e.pool, "side", "msg_id")
	for i := range n {
		id := fmt.Sprintf("m-%d", i)
		want := 1
		if bad[id] {
			want = 0
		}
		if effects[id] != want || side[id] != want {
			t.Errorf("%s: %d effects and %d side rows, want %d of each", id, effects[id], side[id], want)
		}
		if !bad[id] && !e.markerExists("test", id) {
			t.Errorf("%s: no marker", id)
		}
	}
	// The first delivery: every good message commits in that batch.
	first := e.hooks.Batches()[0]
	if first.Size != n || first.Applied != n-len(bad) || first.Retried != len(bad) {
		t.Errorf("first batch: %+v, want %d applied and %d retried", first, n-len(bad), len(bad))
	}
	// Failures found by pipelined passes, then the rest isolated: a
	// healthy message ran at most 5 times for its one delivery (no
	// INSERT is merged here: each message's two INSERTs alternate).
	for i := range n {
		id := fmt.Sprintf("m-%d", i)
		if c := calls[id]; !bad[id] && (c < 1 || c > 5) {
			t.Errorf("%s: handler ran %d times, want 1 to 5", id, c)
		}
	}
}

// TestQueueCallbacks: a callback reads its statement's rows; one that
// queues more statements has them sent in a later round trip; a callback's
// Permanent error parks its message at once, its statements rolled back,
// and a statement's error cannot be dropped by its callback.
func TestQueueCallbacks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL);
		INSERT INTO accounts VALUES ('a', 100), ('b', 5)`); err != nil {
		t.Fatal(err)
	}
	errLow := errors.New("balance too low")
	// Each message debits 10 from the account named in its payload: the
	// balance is read first, and the debit queued from the callback.
	h := func(ctx context.Context, q consumer.Queue, m *consumer.Message) error {
		acct := string(m.Value)
		if acct == "swallow" {
			// A failing statement whose callback pretends all is well.
			q.Queue(`SELECT 1 / 0`).QueryRow(func(row pgx.Row) error {
				var x int
				_ = row.Scan(&x)
				return nil
			})
			q.Queue(`INSERT INTO effects (msg_id, lane, payload) VALUES ($1, $2, $3)`, m.ID, m.Lane, m.Value)
			return nil
		}
		q.Queue(`INSERT INTO effects (msg_id, lane, payload) VALUES ($1, $2, $3)`, m.ID, m.Lane, m.Value)
		q.Queue(`SELECT balance FROM accounts WHERE id = $1`, acct).QueryRow(func(row pgx.Row) error {
			var balance int64
			if err := row.Scan(&balance); err != nil {
				return consumer.Permanent(err) // no such account
			}
			if balance < 10 {
				return consumer.Permanent(errLow)
			}
			q.Queue(`UPDATE accounts SET balance = balance - 10 WHERE id = $1`, acct)
			return nil
		})
		return nil
	}
	payloads := map[string]string{"m-0": "a", "m-1": "b", "m-2": "a", "m-3": "nobody", "m-4": "swallow", "m-5": "a"}
	for i := range len(payloads) {
		id := fmt.Sprintf("m-%d", i)
		e.broker.Publish(0, msg(id, payloads[id]))
	}
	c := e.consumer(consumer.Config{QueueHandler: h, BatchSize: 10, MaxAttempts: 2})
	e.runUntilIdle(c, 30*time.Second)

	var a, b int64
	if err := e.pool.QueryRow(ctx, `SELECT (SELECT balance FROM accounts WHERE id = 'a'), (SELECT balance FROM accounts WHERE id = 'b')`).Scan(&a, &b); err != nil {
		t.Fatal(err)
	}
	if a != 70 || b != 5 {
		t.Errorf("balances a=%d b=%d, want 70 and 5", a, b)
	}
	effects := e.effectCounts()
	for id, want := range map[string]int{"m-0": 1, "m-1": 0, "m-2": 1, "m-3": 0, "m-4": 0, "m-5": 1} {
		if effects[id] != want {
			t.Errorf("%s: %d effects, want %d", id, effects[id], want)
		}
	}
	reasons := map[string]string{}
	for _, p := range e.parked() {
		reasons[*p.DedupeID] = p.Reason + ": " + p.LastError
	}
	for id, want := range map[string]string{
		"m-1": parked.ReasonPermanent + ": ", "m-3": parked.ReasonPermanent + ": ", "m-4": parked.ReasonMaxAttempts + ": ",
	} {
		if !strings.HasPrefix(reasons[id], want) {
			t.Errorf("%s parked as %q, want reason %q", id, reasons[id], want)
		}
	}
	if !strings.Contains(reasons["m-1"], errLow.Error()) || !strings.Contains(reasons["m-3"], "no rows") || !strings.Contains(reasons["m-4"], "division by zero") {
		t.Errorf("parked: %v", reasons)
	}
	if len(reasons) != 3 {
		t.Errorf("parked %v, want m-1, m-3 and m-4", reasons)
	}
}

// TestQueueBadInput: a payload a JSONQueue handler cannot decode, a
// handler that panics, a callback that panics and arguments that cannot be
// encoded are parked (or retried, then parked) with a reason; the batch's
// good messages commit and nothing panics out of the consumer.
func TestQueueBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	type payload struct {
		N int `json:"n"`
	}
	h := consumer.JSONQueue(func(ctx context.Context, q consumer.Queue, m *consumer.Message, p payload) error {
		switch p.N {
		case 1:
			panic("handler panic")
		case 2:
			q.Queue(`SELECT 1`).Exec(func(pgconn.CommandTag) error { panic("callback panic") })
		case 3:
			// An argument pgx cannot encode as an integer, after a good
			// statement of the same message.
			q.Queue(`INSERT INTO effects (msg_id, lane, payload) VALUES ($1, $2, $3)`, m.ID, m.Lane, m.Value)
			q.Queue(`SELECT $1::int`, struct{ X int }{1})
			return nil
		case 4:
			// The same statement, with an argument that encodes: pgx's
			// error names the text, which two messages queued.
			q.Queue(`SELECT $1::int`, 4)
		}
		q.Queue(`INSERT INTO effects (msg_id, lane, payload) VALUES ($1, $2, $3)`, m.ID, m.Lane, m.Value)
		return nil
	})
	for i, v := range []string{`{"n":0}`, `not json`, `{"n":1}`, `{"n":0}`, `{"n":2}`, `{"n":3}`, `{"n":0}`, `{"n":"x"}`, `{"n":0}`, `{"n":4}`} {
		e.broker.Publish(0, msg(fmt.Sprintf("m-%d", i), v))
	}
	e.runUntilIdle(e.consumer(consumer.Config{QueueHandler: h, BatchSize: 20, MaxAttempts: 2}), 30*time.Second)

	reasons := map[string]string{}
	for _, p := range e.parked() {
		reasons[*p.DedupeID] = p.Reason + ": " + p.LastError
	}
	for id, want := range map[string]string{
		"m-1": parked.ReasonPermanent + ": decode payload",
		"m-2": parked.ReasonMaxAttempts + ": handler panicked: handler panic",
		"m-4": parked.ReasonMaxAttempts + ": queued statement",
		"m-5": parked.ReasonMaxAttempts + ": queued statement",
		"m-7": parked.ReasonPermanent + ": decode payload",
	} {
		if !strings.HasPrefix(reasons[id], want) {
			t.Errorf("%s parked as %q, want %q…", id, reasons[id], want)
		}
	}
	if !strings.Contains(reasons["m-4"], "callback panic") {
		t.Errorf("m-4: %q", reasons["m-4"])
	}
	if len(reasons) != 5 {
		t.Errorf("parked %v", reasons)
	}
	effects := e.effectCounts()
	for id, want := range map[string]int{"m-0": 1, "m-3": 1, "m-6": 1, "m-8": 1, "m-9": 1, "m-5": 0} {
		if effects[id] != want {
			t.Errorf("%s: %d effects, want %d", id, effects[id], want)
		}
	}
}

// TestQueueMergedInserts: the single-row INSERTs of a batch are sent as a
// few multi-row ones (a statement trigger counts them) unless
// NoInsertMerge is set; when a merged INSERT fails, the batch runs again
// with its statements as queued, and only the messages whose row breaks
// the constraint are parked; the rest commit in that batch.
func TestQueueMergedInserts(t *testing.T) {
	t.Parallel()
	for _, noMerge := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoInsertMerge=%v", noMerge), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, consumertest.Config{Lanes: 1})
			ctx := context.Background()
			if _, err := e.pool.Exec(ctx, `
CREATE TABLE amounts (msg_id text NOT NULL, n int NOT NULL CHECK (n >= 0));
CREATE TABLE statements (n int NOT NULL);
CREATE FUNCTION count_statement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO statements VALUES (1); RETURN NULL; END $$;
CREATE TRIGGER count_statement AFTER INSERT ON amounts FOR EACH STATEMENT EXECUTE FUNCTION count_statement();`); err != nil {
				t.Fatal(err)
			}
			const n = 40
			bad := map[string]bool{"m-7": true, "m-23": true}
			h := func(ctx context.Context, q consumer.Queue, m *consumer.Message) error {
				v := 1
				if bad[m.ID] {
					v = -1
				}
				q.Queue(`INSERT INTO amounts (msg_id, n) VALUES ($1, $2)`, m.ID, v)
				return nil
			}
			for i := range n {
				id := fmt.Sprintf("m-%d", i)
				e.broker.Publish(0, msg(id, id))
			}
			e.runUntilIdle(e.consumer(consumer.Config{QueueHandler: h, BatchSize: n, MaxAttempts: 1, NoInsertMerge: noMerge}), 30*time.Second)

			parked := e.parked()
			if len(parked) != len(bad) {
				t.Fatalf("parked %d, want %d", len(parked), len(bad))
			}
			for _, p := range parked {
				if !bad[*p.DedupeID] || !strings.Contains(p.LastError, "amounts_n_check") {
					t.Errorf("parked %s: %s", *p.DedupeID, p.LastError)
				}
			}
			rows := consumertest.EffectCounts(t, e.pool, "amounts", "msg_id")
			for i := range n {
				id := fmt.Sprintf("m-%d", i)
				if want := map[bool]int{true: 0, false: 1}[bad[id]]; rows[id] != want {
					t.Errorf("%s: %d rows, want %d", id, rows[id], want)
				}
			}
			if b := e.hooks.Batches(); len(b) != 1 || b[0].Applied != n-len(bad) {
				t.Errorf("batches %+v, want one with %d applied", b, n-len(bad))
			}
			// The committed pass ran with the statements as queued (a
			// merged INSERT failed before): 38 statements. A batch with
			// nothing failing merges its 38 rows into 32 + 4 + 2.
			var statements int
			if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM statements`).Scan(&statements); err != nil {
				t.Fatal(err)
			}
			if statements != n-len(bad) {
				t.Errorf("%d INSERT statements committed, want %d", statements, n-len(bad))
			}
			if _, err := e.pool.Exec(ctx, `TRUNCATE statements`); err != nil {
				t.Fatal(err)
			}
			for i := range n - len(bad) {
				e.broker.Publish(0, msg(fmt.Sprintf("again-%d", i), "again"))
			}
			e.runUntilIdle(e.consumer(consumer.Config{QueueHandler: h, BatchSize: n, NoInsertMerge: noMerge}), 30*time.Second)
			if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM statements`).Scan(&statements); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{false: 3, true: n - len(bad)}[noMerge]; statements != want {
				t.Errorf("%d INSERT statements for %d rows, want %d", statements, n-len(bad), want)
			}
		})
	}
}

// TestQueueAfterSend: a Queue used after its message's statements were
// sent panics rather than drop the statement silently.
func TestQueueAfterSend(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	var kept consumer.Queue
	h := func(ctx context.Context, q consumer.Queue, m *consumer.Message) error {
		kept = q
		return queueEffect(ctx, q, m)
	}
	e.broker.Publish(0, msg("m-0", "x"))
	e.runUntilIdle(e.consumer(consumer.Config{QueueHandler: h}), 30*time.Second)
	if got := e.effectCounts()["m-0"]; got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "after the message's statements were sent") {
			t.Errorf("Queue after the send: recovered %v, want a panic saying why", r)
		}
	}()
	kept.Queue(`SELECT 1`)
}
