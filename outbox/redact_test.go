package outbox

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// secret is what the messages of these tests carry and a parked row must
// not keep.
const secret = "4242424242424242"

// secretMsg is msg with a card number in its value and an e-mail header.
func secretMsg(key, id string) Message {
	return Message{Sink: "s", Key: []byte(key), Value: []byte(`{"id":"` + id + `","card":"` + secret + `"}`), ID: id,
		Headers: []Header{{Key: "email", Value: []byte("ann@example.com")}, {Key: "trace", Value: []byte("t-" + id)}}}
}

// maskCard is a Redact: the card number masked, the e-mail header dropped.
// It also tries to change what it may not (the ID and the key).
func maskCard(m Message) Message {
	m.Value = bytes.ReplaceAll(m.Value, []byte(secret), []byte("################"))
	var kept []Header
	for _, h := range m.Headers {
		if h.Key != "email" {
			kept = append(kept, h)
		}
	}
	m.Headers = kept
	m.ID, m.Key = "changed", nil
	return m
}

// checkRedacted fails t unless every parked row is redacted by maskCard
// and keeps its ID and key, and nothing in the table's parked rows holds
// the secret.
func checkRedacted(t *testing.T, parked []Parked, keys map[string]string) {
	t.Helper()
	for _, p := range parked {
		m := p.Message
		if bytes.Contains(m.Value, []byte(secret)) || !bytes.Contains(m.Value, []byte("################")) {
			t.Errorf("parked %s keeps value %s", m.ID, m.Value)
		}
		if len(m.Headers) != 1 || m.Headers[0].Key != "trace" || string(m.Headers[0].Value) != "t-"+m.ID {
			t.Errorf("parked %s keeps headers %+v", m.ID, m.Headers)
		}
		if k, ok := keys[m.ID]; !ok || string(m.Key) != k {
			t.Errorf("parked row %d: ID %q key %q; Redact may change neither", p.Row, m.ID, m.Key)
		}
	}
}

// TestRedactParked: under RelayConfig.Redact a parked row keeps what Redact
// returned, written by the statement that parks it, for a message its sink
// refused and for one to an unknown sink; a published message goes out
// whole, and a redriven one as redacted, with its ID and key.
func TestRedactParked(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	ctx := context.Background()
	sink := newMemSink()
	sink.refuse["a2"] = Permanent(errors.New("message too large"))
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, Redact: maskCard})
	lost := secretMsg("c", "c1")
	lost.Sink = "nowhere"
	emit(t, db, o, secretMsg("a", "a1"), secretMsg("a", "a2"), lost)
	got := sink.waitFor(t, time.Minute, "a1", hasIDs("a1"))
	if !bytes.Contains(got[0].Value, []byte(secret)) || len(got[0].Headers) != 2 {
		t.Fatalf("a published message was changed: %s %+v", got[0].Value, got[0].Headers)
	}
	waitRows(t, db, time.Minute, 2, `SELECT count(*) FROM effectively.outbox WHERE parked_at IS NOT NULL`)
	parked, err := o.Parked(ctx, db, 10)
	if err != nil || len(parked) != 2 {
		t.Fatalf("parked %+v, %v", parked, err)
	}
	checkRedacted(t, parked, map[string]string{"a2": "a", "c1": "c"})
	var raw int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM effectively.outbox
WHERE parked_at IS NOT NULL AND (position($1::bytea IN value) > 0 OR position($2::bytea IN coalesce(headers, '')) > 0)`,
		[]byte(secret), []byte("ann@example.com")).Scan(&raw); err != nil || raw != 0 {
		t.Fatalf("%d parked rows keep the secret (%v)", raw, err)
	}

	sink.mu.Lock()
	delete(sink.refuse, "a2")
	sink.mu.Unlock()
	if n, err := o.Redrive(ctx, db, parked[0].Row); n != 1 || err != nil {
		t.Fatalf("redrive: %d, %v", n, err)
	}
	got = sink.waitFor(t, time.Minute, "a2", hasIDs("a2"))
	for _, m := range got {
		if m.ID == "a2" && (string(m.Key) != "a" || bytes.Contains(m.Value, []byte(secret))) {
			t.Fatalf("redriven a2: key %q value %s", m.Key, m.Value)
		}
	}
}

// TestRedactFails: a Redact that panics leaves the refused message
// unparked, whole, tried again with the failure recorded, never parked
// with what Redact did not remove.
func TestRedactFails(t *testing.T) {
	db, o := setup(t, Config{Mode: TableMode})
	sink := newMemSink()
	sink.refuse["p1"] = Permanent(errors.New("message too large"))
	startRelay(t, db, RelayConfig{Sinks: map[string]Sink{"s": sink}, Redact: func(m Message) Message {
		if m.ID == "p1" {
			panic("cannot parse the value")
		}
		return m
	}})
	emit(t, db, o, secretMsg("p", "p1"))
	waitAtLeast(t, db, time.Minute, 2, `SELECT coalesce(max(attempts), 0) FROM effectively.outbox
WHERE parked_at IS NULL AND last_error LIKE 'outbox: Redact panicked: cannot parse the value%'`)
	parked, err := o.Parked(context.Background(), db, 10)
	if err != nil || len(parked) != 0 {
		t.Fatalf("parked %+v, %v; want none", parked, err)
	}
}

// TestLogRelayRedactParked: the log relay redacts what it parks, the
// refused message and the later messages of its key parked behind it.
func TestLogRelayRedactParked(t *testing.T) {
	db, o := setup(t, Config{})
	ctx := context.Background()
	sink := newMemSink()
	sink.refuse["a2"] = Permanent(errors.New("too large"))
	r, _ := startLogRelay(t, db, LogRelayConfig{Sinks: map[string]Sink{"s": sink}, Redact: maskCard})
	waitActive(t, r)
	emit(t, db, o, secretMsg("a", "a1"), secretMsg("a", "a2"))
	emit(t, db, o, secretMsg("a", "a3"), secretMsg("b", "b1"))
	sink.waitFor(t, time.Minute, "a1, b1", hasIDs("a1", "b1"))
	waitRows(t, db, time.Minute, 2, `SELECT count(*) FROM effectively.outbox WHERE parked_at IS NOT NULL`)
	parked, err := o.Parked(ctx, db, 10)
	if err != nil || len(parked) != 2 || !strings.Contains(parked[1].Reason, "behind") {
		t.Fatalf("parked %+v, %v", parked, err)
	}
	checkRedacted(t, parked, map[string]string{"a2": "a", "a3": "a"})
}
