package switchover_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/dedupe/switchover"
	"github.com/effectively-once/effectively/pgtest"
)

// The promise across a switch of strategy, mid-run, under redelivery: a
// consumer runs on idset until half the messages are applied and is
// stopped; the same consumer name then runs on the Migration to the new
// strategy while the source delivers everything again from the start (as
// after a reset of a Kafka group's offsets), followed by new messages,
// duplicating some deliveries and losing some acknowledgements. Every message is applied
// exactly once. The same run with the new strategy alone applies some
// twice: the window of doubles the Migration closes.
func TestSwitchMidRunUnderRedelivery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		newer func(testing.TB) dedupe.Strategy
	}{
		{"idset-bloom", func(t testing.TB) dedupe.Strategy { return newBloom(t) }},
		{"idset-highwater", func(t testing.TB) dedupe.Strategy { return newHighwater(t) }},
	} {
		for _, migrate := range []bool{true, false} {
			name := tc.name + map[bool]string{true: "/migration", false: "/new-alone"}[migrate]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				r := runSwitch(t, tc.newer, migrate)
				if migrate {
					for id, n := range r.counts {
						if n != 1 {
							t.Errorf("%s applied %d times", id, n)
						}
					}
					if len(r.counts) != r.want {
						t.Errorf("%d messages applied, want %d", len(r.counts), r.want)
					}
					if r.oldBefore != r.oldAfter {
						t.Errorf("the old store went from %d markers to %d: the Migration wrote to it", r.oldBefore, r.oldAfter)
					}
					return
				}
				twice := 0
				for _, n := range r.counts {
					if n > 1 {
						twice++
					}
				}
				if twice == 0 {
					t.Error("with the new strategy alone no message was applied twice: the run does not test the switch")
				}
				t.Logf("the new strategy alone applied %d of %d messages twice", twice, r.want)
			})
		}
	}
}

type switchRun struct {
	counts              map[string]int
	want                int
	oldBefore, oldAfter int
}

// Messages: lane i carries sender "s<i>", numbered 1, 2, 3, … (its ID is
// "s<i>-<seq>"); the key has both, for the ID strategies and highwater.
const (
	lanes       = 4
	perLane     = 100
	newPerLane  = 25
	consumerOf  = "ledger"
	effectTable = "effects"
)

func seqMessage(lane, seq int) consumer.Message {
	sender := fmt.Sprintf("s%d", lane)
	id := fmt.Sprintf("%s-%d", sender, seq)
	return consumer.Message{
		ID:      id,
		Value:   []byte(id),
		Headers: []consumer.Header{{Key: "sender", Value: []byte(sender)}, {Key: "seq", Value: []byte(strconv.Itoa(seq))}},
	}
}

func bothKey(m *consumer.Message) (dedupe.Key, error) {
	k, err := highwater.HeaderKey(m.Header, "sender", "seq")
	k.ID = m.ID
	return k, err
}

func applyEffect(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (msg_id) VALUES ($1)`, m.ID)
	return err
}

func runSwitch(t *testing.T, newer func(testing.TB) dedupe.Strategy, migrate bool) switchRun {
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	// No unique constraint: a second effect must be countable.
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (msg_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	broker := consumertest.New(consumertest.Config{Lanes: lanes, DuplicateRate: 0.2, LostAckRate: 0.05, Seed: 7})
	for seq := 1; seq <= perLane; seq++ {
		for lane := range lanes {
			broker.Publish(lane, seqMessage(lane, seq))
		}
	}
	cfg := func(s dedupe.Strategy) consumer.Config {
		return consumer.Config{
			Name: consumerOf, Strategy: s, KeyFunc: bothKey, Handler: applyEffect, BatchSize: 10,
			RetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond, Logger: consumertest.Logger(),
		}
	}

	// Before the switch: idset, stopped when about half is applied.
	c1 := consumertest.NewConsumer(t, pool, broker, cfg(newIDSet(t)))
	run := consumertest.Start(c1)
	waitFor(t, pool, lanes*perLane/2)
	run.Stop(t)

	r := switchRun{want: lanes * (perLane + newPerLane)}
	r.oldBefore = count(t, pool, `SELECT count(*) FROM effectively.old_processed`)

	// The switch: the same consumer on the new strategy, with or without
	// the Migration, while everything is delivered again and new messages
	// arrive.
	s := newer(t)
	if migrate {
		m, err := switchover.New(switchover.Config{Old: newIDSet(t), New: s, Since: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		s = m.Strategy()
	}
	broker = consumertest.New(consumertest.Config{Lanes: lanes, DuplicateRate: 0.2, LostAckRate: 0.05, Seed: 8})
	c2 := consumertest.NewConsumer(t, pool, broker, cfg(s))
	run = consumertest.Start(c2)
	for seq := 1; seq <= perLane+newPerLane; seq++ {
		for lane := range lanes {
			broker.Publish(lane, seqMessage(lane, seq))
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	werr := broker.WaitIdle(wctx)
	run.Stop(t)
	if werr != nil {
		t.Fatal(werr)
	}
	if st := broker.Stats(); st.Duplicated == 0 || st.LostAcks == 0 {
		t.Fatalf("the broker duplicated %d deliveries and lost %d acknowledgements: the run does not test redelivery", st.Duplicated, st.LostAcks)
	}
	r.oldAfter = count(t, pool, `SELECT count(*) FROM effectively.old_processed`)
	r.counts = consumertest.EffectCounts(t, pool, effectTable, "msg_id")
	return r
}

// waitFor waits until at least n effects are committed (a guard against a
// hung test bounds the wait, not a performance assertion).
func waitFor(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for count(t, pool, `SELECT count(*) FROM effects`) < n {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d effects after 2 minutes", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
