package outbox

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
)

// TestRollbackEmitsNothing: a rolled-back transaction's messages never
// reach the sink; a committed one's do, whole (nil and empty values kept
// apart, headers kept), with its ID.
func TestRollbackEmitsNothing(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Emit(ctx, tx, Message{Sink: "s", Key: []byte("k"), Value: []byte("rolled back"), ID: "gone"}); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	emit(t, db, o,
		Message{Sink: "s", Key: []byte("k"), Value: nil, ID: "nil-value",
			Headers: []Header{{Key: "h1", Value: []byte("v")}, {Key: "h2", Value: nil}, {Key: "h3", Value: []byte{}}}},
		Message{Sink: "s", Key: []byte("k"), Value: []byte{}, ID: "empty-value"},
		Message{Sink: "s", Value: []byte("no key")})
	sink := newMemSink()
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}})
	got := sink.waitFor(t, 2*time.Minute, "3 messages", func(m []Message) bool { return len(m) >= 3 })
	var sawRandom bool
	for _, m := range got {
		switch m.ID {
		case "gone":
			t.Fatal("a rolled-back message was published")
		case "nil-value":
			if m.Value != nil || len(m.Headers) != 3 || string(m.Headers[0].Value) != "v" ||
				m.Headers[1].Value != nil || m.Headers[2].Value == nil {
				t.Fatalf("nil-value arrived as %+v", m)
			}
		case "empty-value":
			if m.Value == nil || len(m.Value) != 0 {
				t.Fatalf("empty value arrived as %#v", m.Value)
			}
		default:
			if !strings.HasPrefix(m.ID, "ob0-") || m.Key != nil {
				t.Fatalf("unexpected message %+v", m)
			}
			sawRandom = true
		}
	}
	if !sawRandom {
		t.Fatal("the message without an ID was not given one")
	}
	if o := firstOrder(got)["k"]; strings.Join(o, ",") != "nil-value,empty-value" {
		t.Fatalf("order of key k: %v", o)
	}
}

// TestEmitValidates: what can be known at Emit fails there, clearly, and
// writes nothing of the batch.
func TestEmitValidates(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode, Sinks: []string{"orders"}, MaxMessageBytes: 100})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		m    Message
		want string
	}{
		{"empty sink", Message{}, "empty sink"},
		{"unknown sink", Message{Sink: "ordrs"}, "unknown sink"},
		{"empty header", Message{Sink: "orders", Headers: []Header{{Key: ""}}}, "empty name"},
		{"bad header", Message{Sink: "orders", Headers: []Header{{Key: "a\x00b"}}}, "NUL"},
		{"id header", Message{Sink: "orders", Headers: []Header{{Key: "Idempotency-Key"}}}, "set ID instead"},
		{"too large", Message{Sink: "orders", Value: make([]byte, 200)}, "larger than MaxMessageBytes"},
		{"bad id", Message{Sink: "orders", ID: "\xff"}, "UTF-8"},
	} {
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			return o.Emit(ctx, tx, Message{Sink: "orders", ID: "fine"}, tc.m)
		})
		var me *MessageError
		if !errors.Is(err, ErrInvalid) || !errors.As(err, &me) || me.Index != 1 || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an ErrInvalid for message 1 saying %q", tc.name, err, tc.want)
		}
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM effectively.outbox`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows after refused emits: %d, %v", n, err)
	}
}

// TestEmitBatchSeq: one call with several messages per key numbers each
// key's messages densely, in the order given, after what earlier
// transactions took.
func TestEmitBatchSeq(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	emit(t, db, o, Message{Sink: "s", Key: []byte("a"), ID: "a1"})
	emit(t, db, o,
		Message{Sink: "s", Key: []byte("b"), ID: "b1"},
		Message{Sink: "s", Key: []byte("a"), ID: "a2"},
		Message{Sink: "s", Key: []byte("b"), ID: "b2"},
		Message{Sink: "t", Key: []byte("a"), ID: "ta1"},
		Message{Sink: "s", Key: []byte("a"), ID: "a3"})
	rows, err := db.Query(context.Background(), `SELECT msg_id, seq FROM effectively.outbox ORDER BY msg_id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var id string
	var seq int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &seq}, func() error {
		got = append(got, id+"="+string(rune('0'+seq)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if s := strings.Join(got, " "); s != "a1=1 a2=2 a3=3 b1=1 b2=2 ta1=1" {
		t.Fatalf("seqs: %s", s)
	}
}

// TestIDs: IDs derive from (scope, input key, ordinal): the same input
// gives the same IDs, another ordinal, key or scope another.
func TestIDs(t *testing.T) {
	in := func(scope, id string) *consumer.Message {
		return &consumer.Message{DedupeKey: dedupe.Key{Scope: scope, ID: id}}
	}
	a := ID(in("A", "x"), 0)
	if a != ID(in("A", "x"), 0) {
		t.Fatal("the same input gave two IDs")
	}
	for _, other := range []string{ID(in("A", "x"), 1), ID(in("A", "y"), 0), ID(in("A2", "x"), 0), ID(in("Ax", ""), 0)} {
		if other == a {
			t.Fatal("different inputs or ordinals gave the same ID")
		}
	}
	db, o := setup(t, Config{Mode: TableMode})
	ctx := context.Background()
	m := in("A", "x")
	if err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		return o.EmitFor(ctx, tx, m, Message{Sink: "s"}, Message{Sink: "s", ID: "mine"}, Message{Sink: "s"})
	}); err != nil {
		t.Fatal(err)
	}
	var got []string
	rows, _ := db.Query(ctx, `SELECT msg_id FROM effectively.outbox ORDER BY id`)
	var id string
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { got = append(got, id); return nil }); err != nil {
		t.Fatal(err)
	}
	want := []string{ID(m, 0), "mine", ID(m, 2)}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("IDs %v, want %v", got, want)
	}
}

func TestHeadersRoundTrip(t *testing.T) {
	hs := []Header{{Key: "a", Value: nil}, {Key: "bb", Value: []byte{}}, {Key: "c", Value: bytes.Repeat([]byte{7}, 300)}}
	got, err := decodeHeaders(encodeHeaders(hs))
	if err != nil || len(got) != 3 || got[0].Value != nil || got[1].Value == nil || len(got[2].Value) != 300 {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := decodeHeaders([]byte{5, 'a'}); err == nil {
		t.Fatal("corrupt headers decoded")
	}
}
