package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
)

// A message whose writes violate a deferred constraint makes the COMMIT
// itself fail. That message alone is retried and then parked; the rest of
// its batch commits, and the lane moves on.
func TestCommitRefusedByDeferredConstraint(t *testing.T) {
	t.Parallel()
	for _, batchHandler := range []bool{false, true} {
		t.Run(fmt.Sprintf("batchHandler=%v", batchHandler), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, consumertest.Config{Lanes: 2})
			ctx := context.Background()
			if _, err := e.pool.Exec(ctx, `
CREATE TABLE accounts (id text PRIMARY KEY);
INSERT INTO accounts VALUES ('good');
CREATE TABLE ledger (
	msg_id  text NOT NULL,
	account text NOT NULL REFERENCES accounts (id) DEFERRABLE INITIALLY DEFERRED
)`); err != nil {
				t.Fatal(err)
			}
			const n = 40
			poison := map[string]bool{"m-7": true, "m-8": true, "m-25": true}
			for i := range n {
				id := fmt.Sprintf("m-%d", i)
				account := "good"
				if poison[id] {
					account = "missing"
				}
				e.broker.Publish(i%2, consumer.Message{ID: id, Value: []byte(account)})
			}
			write := func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
				ids, accounts := make([]string, len(msgs)), make([]string, len(msgs))
				for i, m := range msgs {
					ids[i], accounts[i] = m.ID, string(m.Value)
				}
				if _, err := tx.Exec(ctx, `INSERT INTO ledger SELECT * FROM unnest($1::text[], $2::text[])`, ids, accounts); err != nil {
					return err
				}
				return insertEffects(ctx, tx, msgs)
			}
			cfg := consumer.Config{BatchSize: 10, MaxAttempts: 3}
			if batchHandler {
				cfg.BatchHandler = write
			} else {
				cfg.Handler = func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					return write(ctx, tx, []*consumer.Message{m})
				}
			}
			e.runUntilIdle(e.consumer(cfg), time.Minute)

			counts := e.effectCounts()
			for i := range n {
				id := fmt.Sprintf("m-%d", i)
				want := 1
				if poison[id] {
					want = 0
				}
				if counts[id] != want {
					t.Errorf("%s has %d effects, want %d", id, counts[id], want)
				}
			}
			rows := e.parked()
			got := map[string]bool{}
			for _, p := range rows {
				got[*p.DedupeID] = true
				if p.Reason != parked.ReasonMaxAttempts {
					t.Errorf("%s parked with reason %s, want %s", *p.DedupeID, p.Reason, parked.ReasonMaxAttempts)
				}
				if p.Attempts != 3 {
					t.Errorf("%s parked after %d attempts, want 3", *p.DedupeID, p.Attempts)
				}
			}
			if len(rows) != len(poison) || !got["m-7"] || !got["m-8"] || !got["m-25"] {
				t.Errorf("parked %v, want the poison messages %v", got, poison)
			}
		})
	}
}

// When the connection breaks after the server committed but before the
// client heard so, the consumer finds out on another connection that the
// batch committed: it reports every message applied (none unknown) and
// acknowledges them, so they are not delivered again.
func TestCommitLostAfterCommitIsResolved(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	d := &pgtest.CommitLoss{}
	pool := d.Pool(t, e.pool.Config().ConnString())
	const n = 10
	for i := range n {
		e.broker.Publish(0, msg(fmt.Sprintf("m-%d", i), "x"))
	}
	var once sync.Once
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "m-3" {
			once.Do(d.Arm)
		}
		return insertEffect(ctx, tx, m)
	}
	outcomes := &outcomeCounter{}
	c := consumertest.NewConsumer(t, pool, e.broker, e.config(consumer.Config{Handler: h, BatchSize: n, Concurrency: 1, Hooks: []consumer.Hook{outcomes}}))
	consumertest.RunUntilIdle(t, c, e.broker, time.Minute)

	if d.Dropped() != 1 {
		t.Fatalf("%d COMMIT replies dropped, want 1: the test did not lose a commit", d.Dropped())
	}
	counts := e.effectCounts()
	for i := range n {
		if id := fmt.Sprintf("m-%d", i); counts[id] != 1 {
			t.Errorf("%s has %d effects, want 1", id, counts[id])
		}
	}
	tot := e.hooks.Total()
	if u := unknowns(e.hooks); u != 0 || tot.Applied != n || tot.Duplicate != 0 {
		t.Errorf("reported %d unknown, %d applied, %d duplicate; want 0 unknown, %d applied and no redelivery", u, tot.Applied, tot.Duplicate, n)
	}
	if got := outcomes.count(consumer.OutcomeApplied); got != n {
		t.Errorf("MessageDone reported %d messages as applied, want %d", got, n)
	}
	if got := commitLost(e.hooks, false); got != 1 {
		t.Errorf("%d batches say CommitLost without an error, want 1", got)
	}
	if p := e.broker.Pending(); len(p) != 0 {
		t.Errorf("%d messages still pending at the broker", len(p))
	}
}

// When the server ends the session during COMMIT (here a deferred trigger
// terminates its own backend) the transaction did not commit; the consumer
// finds that out on another connection, reports nothing unknown, and the
// redelivery applies every message once.
func TestCommitLostSessionTerminatedIsResolved(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `
CREATE SEQUENCE kill_once;
CREATE FUNCTION kill_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.msg_id = 'm-3' AND nextval('kill_once') = 1 THEN
		PERFORM pg_terminate_backend(pg_backend_pid());
		PERFORM pg_sleep(1); -- the termination interrupts this
	END IF;
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER kill_at_commit AFTER INSERT ON effects
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION kill_at_commit()`); err != nil {
		t.Fatal(err)
	}
	const n = 10
	for i := range n {
		e.broker.Publish(0, msg(fmt.Sprintf("m-%d", i), "x"))
	}
	e.runUntilIdle(e.consumer(consumer.Config{BatchSize: n, Concurrency: 1}), time.Minute)

	var killed int64
	if err := e.pool.QueryRow(ctx, `SELECT last_value FROM kill_once WHERE is_called`).Scan(&killed); err != nil {
		t.Fatalf("the trigger never ran: %v", err)
	}
	counts := e.effectCounts()
	for i := range n {
		if id := fmt.Sprintf("m-%d", i); counts[id] != 1 {
			t.Errorf("%s has %d effects, want 1", id, counts[id])
		}
	}
	if u, a := unknowns(e.hooks), e.hooks.Total().Applied; u != 0 || a != n {
		t.Errorf("reported %d unknown, %d applied; want 0 unknown and %d applied", u, a, n)
	}
	if got := commitLost(e.hooks, true); got != 1 {
		t.Errorf("%d batches say CommitLost with an error (rolled back), want 1", got)
	}
	if len(e.parked()) != 0 {
		t.Errorf("parked %+v", e.parked())
	}
}

func unknowns(c *consumertest.Counter) int {
	n := 0
	for _, b := range c.Batches() {
		n += b.Unknown
	}
	return n
}

// commitLost counts the batches whose COMMIT lost its reply and was
// resolved: committed (rolledBack false) or not.
func commitLost(c *consumertest.Counter, rolledBack bool) int {
	n := 0
	for _, b := range c.Batches() {
		if b.CommitLost && (b.Err != nil) == rolledBack {
			n++
		}
	}
	return n
}

// outcomeCounter counts what MessageDone reports.
type outcomeCounter struct {
	mu sync.Mutex
	n  map[consumer.Outcome]int
}

func (o *outcomeCounter) BatchDone(context.Context, *consumer.BatchStats) {}

func (o *outcomeCounter) MessageDone(_ context.Context, e consumer.MessageEvent) {
	out := e.Outcome
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[consumer.Outcome]int{}
	}
	o.n[out]++
}

func (o *outcomeCounter) count(out consumer.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[out]
}
