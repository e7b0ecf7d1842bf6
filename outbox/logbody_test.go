package outbox

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

// TestLogBodyRoundTrip: a log row's body gives back every message as
// emitted, nil and empty keys, values and headers told apart; a body cut
// short or with bytes left over is refused, never read as other messages.
func TestLogBodyRoundTrip(t *testing.T) {
	o, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{
		{Sink: "s", Key: []byte("k"), Value: []byte("v"), ID: "a", Headers: []Header{{Key: "h", Value: []byte("x")}, {Key: "n"}}},
		{Sink: "s", Key: nil, Value: nil, ID: "b"},
		{Sink: "other", Key: []byte{}, Value: []byte{}, ID: "c", Headers: []Header{{Key: "e", Value: []byte{}}}},
	}
	rs, err := o.rows(msgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := encodeLogBody(&rs)
	at := time.Unix(1700000000, 0)
	got, err := decodeLogBody(7, at, body)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(msgs) {
		t.Fatalf("%d messages, want %d", len(got), len(msgs))
	}
	for i, x := range got {
		if !reflect.DeepEqual(x.msg, msgs[i]) || x.part != rs.parts[i] || x.id != logRowID(7, i) || !x.created.Equal(at) {
			t.Fatalf("message %d: got %+v (part %d, id %d), want %+v (part %d)", i, x.msg, x.part, x.id, msgs[i], rs.parts[i])
		}
	}
	for n := range len(body) {
		if _, err := decodeLogBody(7, at, body[:n]); err == nil {
			t.Fatalf("a body cut to %d of %d bytes was read", n, len(body))
		}
	}
	if _, err := decodeLogBody(7, at, append(body, 0)); !errors.Is(err, errLogBody) {
		t.Fatalf("a body with a byte left over: %v", err)
	}
}
