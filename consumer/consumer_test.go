package consumer_test

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
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
)

func TestAppliesEachMessageOnceDespiteDuplicates(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 4, DuplicateRate: 0.5})
	for i, id := range ids("m", 400) {
		e.broker.Publish(i, msg(id, "payload-"+id))
	}
	e.runUntilIdle(e.consumer(consumer.Config{BatchSize: 50}), 30*time.Second)

	counts := e.effectCounts()
	if len(counts) != 400 {
		t.Fatalf("effects for %d messages, want 400", len(counts))
	}
	for id, n := range counts {
		if n != 1 {
			t.Errorf("message %s applied %d times", id, n)
		}
	}
	st := e.hooks.Total()
	if st.Applied != 400 || st.Duplicate == 0 {
		t.Errorf("stats: applied %d duplicates %d; want 400 applied and some duplicates", st.Applied, st.Duplicate)
	}
	if st.Applied+st.Duplicate != e.broker.Stats().Delivered {
		t.Errorf("applied+duplicate = %d, delivered = %d", st.Applied+st.Duplicate, e.broker.Stats().Delivered)
	}
}

func TestFailedHandlerLeavesNoMarkerAndOthersCommit(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, consumertest.Config{Lanes: 1})
			for _, id := range ids("m", 20) {
				e.broker.Publish(0, msg(id, id))
			}
			var seenAfterFailure atomic.Int32
			fail := func(m *consumer.Message) error {
				if m.ID == "m-7" && m.Attempt == 1 {
					return errors.New("transient")
				}
				return nil
			}
			cfg := consumer.Config{BatchSize: 20, Concurrency: 1, RetryBackoff: 200 * time.Millisecond, MaxRetryBackoff: 200 * time.Millisecond}
			if batch {
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
			// After the first batch commits, m-7 is waiting for its retry:
			// check that it left no marker and no effect, and that the other
			// 19 committed.
			cfg.Hooks = append(cfg.Hooks, hookFunc(func(ctx context.Context, s *consumer.BatchStats) {
				if s.Retried == 1 && seenAfterFailure.Add(1) == 1 {
					if e.markerExists("test", "m-7") {
						t.Error("failed message left a marker")
					}
					if n := e.effectCounts()["m-7"]; n != 0 {
						t.Errorf("failed message left %d effects", n)
					}
					if s.Applied != 19 {
						t.Errorf("applied %d in the failing batch, want 19", s.Applied)
					}
				}
			}))
			e.runUntilIdle(e.consumer(cfg), 30*time.Second)
			if seenAfterFailure.Load() == 0 {
				t.Fatal("the failure was never observed")
			}
			counts := e.effectCounts()
			if len(counts) != 20 || counts["m-7"] != 1 {
				t.Fatalf("effects %v: want all 20 once, m-7 included after its retry", counts)
			}
			if !e.markerExists("test", "m-7") {
				t.Error("retried message has no marker after it applied")
			}
		})
	}
}

func TestPoisonMessageIsRetriedThenParked(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, consumertest.Config{Lanes: 2})
			for i, id := range ids("m", 100) {
				e.broker.Publish(i, msg(id, id))
			}
			poison := map[string]bool{"m-13": true, "m-50": true, "m-51": true}
			var poisonCalls atomic.Int32
			cfg := consumer.Config{BatchSize: 25, MaxAttempts: 3}
			if batch {
				cfg.BatchHandler = func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
					for _, m := range msgs {
						if poison[m.ID] {
							poisonCalls.Add(1)
							return fmt.Errorf("cannot apply %s", m.ID)
						}
					}
					return insertEffects(ctx, tx, msgs)
				}
			} else {
				cfg.Handler = func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					if poison[m.ID] {
						poisonCalls.Add(1)
						return fmt.Errorf("cannot apply %s", m.ID)
					}
					return insertEffect(ctx, tx, m)
				}
			}
			e.runUntilIdle(e.consumer(cfg), 30*time.Second)
			counts := e.effectCounts()
			if len(counts) != 97 {
				t.Errorf("%d messages applied, want 97", len(counts))
			}
			for id := range poison {
				if counts[id] != 0 {
					t.Errorf("poison %s has an effect", id)
				}
			}
			rows := e.parked()
			if len(rows) != 3 {
				t.Fatalf("parked %d rows, want 3: %+v", len(rows), rows)
			}
			for _, p := range rows {
				if p.DedupeID == nil || !poison[*p.DedupeID] || p.Reason != parked.ReasonMaxAttempts || p.Attempts != 3 || !p.HasMarker {
					t.Errorf("parked row %+v: want a poison message, reason max_attempts, 3 attempts, with marker", p)
				}
				if !strings.Contains(p.LastError, "cannot apply") || string(p.Payload) != *p.DedupeID {
					t.Errorf("parked row lost the message or its error: %+v", p)
				}
			}
			if poisonCalls.Load() < 9 {
				t.Errorf("poison handler ran %d times, want at least 3 attempts each", poisonCalls.Load())
			}
		})
	}
}

func TestPermanentErrorParksAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	e.broker.Publish(0, msg("ok", `{"amount": 5}`))
	e.broker.Publish(0, msg("bad", `{"amount": "five"}`))
	e.broker.Publish(0, msg("refused", `{"amount": -1}`))
	type transfer struct{ Amount int }
	var refusedAttempts sync.Map
	h := consumer.JSON(func(ctx context.Context, tx pgx.Tx, m *consumer.Message, v transfer) error {
		if v.Amount < 0 {
			refusedAttempts.Store(m.Attempt, true)
			return consumer.Permanent(errors.New("negative amount"))
		}
		return insertEffect(ctx, tx, m)
	})
	e.runUntilIdle(e.consumer(consumer.Config{Handler: h, MaxAttempts: 5}), 30*time.Second)
	if got := e.effectCounts(); len(got) != 1 || got["ok"] != 1 {
		t.Fatalf("effects %v, want only ok", got)
	}
	reasons := map[string]string{}
	for _, p := range e.parked() {
		reasons[*p.DedupeID] = p.Reason + ": " + p.LastError
		if p.Attempts != 1 {
			t.Errorf("%s parked after %d attempts, want 1", *p.DedupeID, p.Attempts)
		}
	}
	if !strings.HasPrefix(reasons["bad"], "permanent: decode payload") || !strings.Contains(reasons["refused"], "negative amount") {
		t.Errorf("parked reasons %v", reasons)
	}
	refusedAttempts.Range(func(k, _ any) bool {
		if k.(int) != 1 {
			t.Errorf("a permanent failure was delivered again (attempt %d)", k)
		}
		return true
	})
}

func TestBadKeysAreParkedAndTheLoopKeepsRunning(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	cases := []consumer.Message{
		{Value: []byte("no id")},
		{ID: strings.Repeat("k", 65), Value: []byte("long")},
		{ID: "a\x00b", Value: []byte("nul")},
		{ID: "a\xffb", Value: []byte("utf8")},
	}
	for _, m := range cases {
		e.broker.Publish(0, m)
	}
	e.broker.Publish(0, msg("good", "good"))
	e.broker.Publish(0, consumer.Message{ID: "keyfunc-panics", Value: []byte("panic")})
	e.broker.Publish(0, consumer.Message{ID: "keyfunc-fails", Value: []byte("fail")})
	keyFunc := func(m *consumer.Message) (k dedupe.Key, err error) {
		switch m.ID {
		case "keyfunc-panics":
			panic("boom")
		case "keyfunc-fails":
			return k, errors.New("no event_id")
		}
		return consumer.DefaultKey(m)
	}
	// The good message's handler crashes the consumer once, after its batch
	// parked the bad ones: the batch commits, its acks are lost, and every
	// message is delivered again.
	var crashed atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if !crashed.Swap(true) {
			e.broker.Crash()
		}
		return insertEffect(ctx, tx, m)
	}
	e.runUntilIdle(e.consumer(consumer.Config{MaxKeyLen: 64, KeyFunc: keyFunc, Handler: h}), 30*time.Second)
	if e.broker.Stats().Crashes != 1 {
		t.Fatal("no crash happened")
	}
	if got := e.effectCounts(); len(got) != 1 || got["good"] != 1 {
		t.Fatalf("effects %v, want only good", got)
	}
	rows := e.parked()
	if len(rows) != 6 {
		t.Fatalf("parked %d, want 6: %+v", len(rows), rows)
	}
	want := []string{"no ID and no sender", "over the limit of 64", "NUL byte", "not valid UTF-8", "handler panicked: boom", "no event_id"}
	for i, p := range rows {
		if p.Reason != parked.ReasonInvalidKey || p.HasMarker || !strings.Contains(p.LastError, want[i]) {
			t.Errorf("parked[%d] = %+v, want invalid_key mentioning %q", i, p, want[i])
		}
	}
}

func TestPanickingHandlerIsRetriedThenParked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 1})
	e.broker.Publish(0, msg("a", "a"))
	e.broker.Publish(0, msg("boom", "boom"))
	e.broker.Publish(0, msg("b", "b"))
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "boom" {
			panic(fmt.Sprintf("cannot handle %s", m.ID))
		}
		return insertEffect(ctx, tx, m)
	}
	e.runUntilIdle(e.consumer(consumer.Config{Handler: h, MaxAttempts: 2}), 30*time.Second)
	if got := e.effectCounts(); len(got) != 2 {
		t.Fatalf("effects %v, want a and b", got)
	}
	p := e.parked()
	if len(p) != 1 || p[0].Reason != parked.ReasonMaxAttempts || !strings.Contains(p[0].LastError, "handler panicked") {
		t.Fatalf("parked %+v", p)
	}
}

func TestMismatchIsReportedAndTreatedAsDuplicate(t *testing.T) {
	t.Parallel()
	for _, policy := range []consumer.MismatchPolicy{consumer.MismatchDuplicate, consumer.MismatchPark} {
		t.Run(fmt.Sprint(policy), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, consumertest.Config{Lanes: 1})
			e.broker.Publish(0, msg("evt-1", `{"amount":10}`))
			e.broker.Publish(0, msg("evt-1", `{"amount":10}`)) // producer resend
			e.broker.Publish(0, msg("evt-1", `{"amount":99}`)) // producer bug
			e.runUntilIdle(e.consumer(consumer.Config{OnMismatch: policy, BatchSize: 1}), 30*time.Second)
			if got := e.effectCounts(); got["evt-1"] != 1 {
				t.Fatalf("effects %v", got)
			}
			st := e.hooks.Total()
			rows := e.parked()
			switch policy {
			case consumer.MismatchDuplicate:
				if st.Mismatch != 1 || st.Duplicate != 1 || len(rows) != 0 {
					t.Errorf("mismatch %d duplicate %d parked %d, want 1 1 0", st.Mismatch, st.Duplicate, len(rows))
				}
			case consumer.MismatchPark:
				if st.Parked != 1 || len(rows) != 1 || rows[0].Reason != parked.ReasonMismatch || string(rows[0].Payload) != `{"amount":99}` {
					t.Errorf("parked %+v, want the amount 99 message with reason mismatch", rows)
				}
			}
		})
	}
}

func TestShutdownLosesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{Lanes: 4})
	const n = 2000
	for i, id := range ids("m", n) {
		e.broker.Publish(i, msg(id, id))
	}
	var handled atomic.Int32
	slow := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		handled.Add(1)
		time.Sleep(100 * time.Microsecond)
		return insertEffect(ctx, tx, m)
	}
	for round := 0; ; round++ {
		c := e.consumer(consumer.Config{Handler: slow, BatchSize: 20})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		// Stop while batches are in flight.
		for handled.Load() < int32((round+1)*300) && !e.broker.Idle() {
			time.Sleep(time.Millisecond)
		}
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("Run did not return after cancel")
		}
		// Whatever was acknowledged has exactly one effect: nothing acked was lost.
		counts := e.effectCounts()
		for id, k := range counts {
			if k != 1 {
				t.Fatalf("round %d: %s applied %d times", round, id, k)
			}
		}
		if acked := n - e.broker.Unacked(); len(counts) < acked {
			t.Fatalf("round %d: %d messages acknowledged but only %d effects", round, acked, len(counts))
		}
		if e.broker.Idle() {
			break
		}
		if round > 50 {
			t.Fatal("did not finish")
		}
	}
	if got := len(e.effectCounts()); got != n {
		t.Fatalf("%d effects, want %d", got, n)
	}
}

func TestRunWithoutMigrateSaysSo(t *testing.T) {
	t.Parallel()
	e := newEnv(t, consumertest.Config{})
	c, err := consumer.New(e.pool, e.broker, e.config(consumer.Config{}))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("Run = %v, want an error telling to call Migrate", err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	s, err := idset.New(idset.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h := insertEffect
	bh := insertEffects
	cases := map[string]consumer.Config{
		"no name":          {Strategy: s, Handler: h},
		"no strategy":      {Name: "x", Handler: h},
		"no handler":       {Name: "x", Strategy: s},
		"two handlers":     {Name: "x", Strategy: s, Handler: h, BatchHandler: bh},
		"batch too big":    {Name: "x", Strategy: s, Handler: h, BatchSize: 1_000_000},
		"negative batch":   {Name: "x", Strategy: s, Handler: h, BatchSize: -1},
		"negative conc":    {Name: "x", Strategy: s, Handler: h, Concurrency: -2},
		"negative retries": {Name: "x", Strategy: s, Handler: h, MaxAttempts: -1},
		"negative backoff": {Name: "x", Strategy: s, Handler: h, RetryBackoff: -time.Second},
		"bad scope":        {Name: "x", Scope: "a\x00b", Strategy: s, Handler: h},
		"bad policy":       {Name: "x", Strategy: s, Handler: h, OnMismatch: 7},
	}
	broker := consumertest.New(consumertest.Config{})
	for name, cfg := range cases {
		_, err := consumer.New(noDB{}, broker, cfg)
		var ce *consumer.ConfigError
		if !errors.Is(err, consumer.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field == "" {
			t.Errorf("%s: New = %v, want a *ConfigError", name, err)
		}
	}
	if _, err := consumer.New(noDB{}, broker, consumer.Config{Name: "x", Strategy: s, Handler: h}); err != nil {
		t.Errorf("valid config refused: %v", err)
	}
}

// noDB is no database at all: New only validates, and must not call it.
type noDB struct{ pg.DB }

type hookFunc func(ctx context.Context, s *consumer.BatchStats)

func (f hookFunc) BatchDone(ctx context.Context, s *consumer.BatchStats) { f(ctx, s) }
