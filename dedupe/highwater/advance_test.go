package highwater_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/jackc/pgx/v5"
)

// TestStuckAndAdvance: a sender held back behind a hole is listed by Stuck
// and logged with its mark and lowest held seq; Advance moves its mark past
// the hole with an audit row, after which the held message applies; Advance
// refuses to move a mark backwards and needs a reason.
func TestStuckAndAdvance(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t)
	var logs logBuffer
	s := newStrategy(t, pool, highwater.Config{StuckAfter: time.Nanosecond, Logger: logs.logger()})
	ctx := context.Background()

	claimTx(t, pool, s, keys("a", 1, 2), nil)
	if got := verdictNames(claimTx(t, pool, s, keys("a", 6, 5), nil)); got != "gap gap" {
		t.Fatalf("verdicts %q, want gap gap", got)
	}
	claimTx(t, pool, s, keys("b", 1), nil)
	stuck := s.Stuck()
	if len(stuck) != 1 {
		t.Fatalf("Stuck() = %+v, want sender a", stuck)
	}
	if st := stuck[0]; st.Scope != "test" || st.Sender != "a" || st.Mark != 2 || st.LowestHeld != 5 || st.Since.IsZero() {
		t.Errorf("Stuck()[0] = %+v, want a with mark 2 and lowest held 5", st)
	}
	// Delivered again: still stuck, and now stuck longer than StuckAfter.
	claimTx(t, pool, s, keys("a", 5), nil)
	log := logs.String()
	for _, want := range []string{"stuck", "sender=a", "mark=2", "lowest_held=5"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if n := s.Stats().StuckSenders; n != 1 {
		t.Errorf("Stats.StuckSenders = %d, want 1", n)
	}

	advance := func(to int64, reason string) (int64, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		from, err := s.Advance(ctx, tx, "test", "a", to, reason)
		if err == nil {
			err = tx.Commit(ctx)
		}
		return from, err
	}
	if _, err := advance(4, "  "); err == nil || !strings.Contains(err.Error(), "reason") {
		t.Errorf("Advance without a reason: %v", err)
	}
	if from, err := advance(4, "seq 3 and 4 lost in the outage of 1 May"); err != nil || from != 2 {
		t.Fatalf("Advance = %d, %v; want from 2", from, err)
	}
	if got := s.Stuck(); len(got) != 0 {
		t.Errorf("Stuck() after Advance = %+v", got)
	}
	if got := verdictNames(claimTx(t, pool, s, keys("a", 3, 5, 6), nil)); got != "duplicate new new" {
		t.Errorf("after Advance: %q, want duplicate new new", got)
	}

	from, err := advance(5, "too late")
	if !errors.Is(err, highwater.ErrBackwards) || from != 6 || !strings.Contains(err.Error(), "is 6") {
		t.Errorf("Advance backwards = %d, %v; want ErrBackwards from 6", from, err)
	}
	if from, err := advance(6, "again"); err != nil || from != 6 {
		t.Errorf("Advance to the mark itself = %d, %v; want a no-op", from, err)
	}
	// A sender without a mark starts from 0.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if from, err := s.Advance(ctx, tx, "test", "new-sender", 10, "starts at 11"); err != nil || from != 0 {
		t.Errorf("Advance of a new sender = %d, %v", from, err)
	}
	if _, err := s.Advance(ctx, tx, "test", "", 10, "x"); !errors.Is(err, dedupe.ErrInvalidKey) {
		t.Errorf("Advance without a sender: %v", err)
	}
	tx.Rollback(ctx)

	rows, err := pool.Query(ctx, `SELECT scope, sender, from_seq, to_seq, reason FROM effectively.marks_advances ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type audit struct {
		Scope, Sender string
		From, To      int64
		Reason        string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[audit])
	if err != nil {
		t.Fatal(err)
	}
	want := []audit{{"test", "a", 2, 4, "seq 3 and 4 lost in the outage of 1 May"}}
	if len(got) != 1 || got[0] != want[0] {
		t.Errorf("audit rows = %+v, want %+v", got, want)
	}
	if m := marks(t, pool, "marks"); m["a"] != 6 || m["new-sender"] != 0 {
		t.Errorf("marks = %v", m)
	}
}

// TestReorderWindow: shuffled delivery within the window is held back and
// applied in order as the holes fill; a seq beyond the window is still a
// gap (held, not dropped) but is logged and counted as suspicious.
func TestReorderWindow(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t)
	var logs logBuffer
	s := newStrategy(t, pool, highwater.Config{ReorderWindow: 10, Logger: logs.logger()})
	setupTotal(t, pool)

	// Redeliver until acknowledged, in a shuffled order, like an SQS
	// standard queue: the effect must be applied in seq order.
	pending := []int64{7, 3, 9, 1, 10, 4, 2, 8, 6, 5}
	var order []int64
	for round := 0; len(pending) > 0; round++ {
		if round > 20 {
			t.Fatalf("not drained: %v", pending)
		}
		var next []int64
		for _, seq := range pending {
			v := claimTx(t, pool, s, keys("a", seq), nil)[0]
			switch v {
			case dedupe.VerdictNew:
				order = append(order, seq)
			case dedupe.VerdictGap:
				next = append(next, seq)
			default:
				t.Fatalf("seq %d: %v", seq, v)
			}
		}
		pending = next
	}
	for i, seq := range order {
		if seq != int64(i+1) {
			t.Fatalf("applied in order %v, want 1..10", order)
		}
	}
	if strings.Contains(logs.String(), "far ahead") || s.Stats().FarGaps != 0 {
		t.Errorf("gaps within the window were reported as suspicious: %s", logs.String())
	}

	// 10 + 1 + 10 = 21 is the last seq inside the window.
	if got := verdictNames(claimTx(t, pool, s, keys("a", 21, 22), nil)); got != "gap gap" {
		t.Errorf("verdicts %q, want gap gap", got)
	}
	if st := s.Stats(); st.FarGaps != 1 {
		t.Errorf("Stats.FarGaps = %d, want 1", st.FarGaps)
	}
	for _, want := range []string{"far ahead", "sender=a", "mark=10", "seq=22", "reorder_window=10"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

// TestStuckWarningWithoutRedelivery: a stuck sender is still reported when
// its held messages stop coming (parked after too many gap deliveries, say),
// as long as claims of other senders run.
func TestStuckWarningWithoutRedelivery(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t)
	var logs logBuffer
	s := newStrategy(t, pool, highwater.Config{StuckAfter: 20 * time.Millisecond, Logger: logs.logger()})
	claimTx(t, pool, s, keys("x", 1, 3), nil)
	if strings.Contains(logs.String(), "stuck") {
		t.Fatalf("warned at once: %s", logs.String())
	}
	time.Sleep(30 * time.Millisecond)
	claimTx(t, pool, s, keys("y", 1), nil)
	for _, want := range []string{"stuck", "sender=x", "mark=1", "lowest_held=3"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}
