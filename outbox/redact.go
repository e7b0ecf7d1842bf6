package outbox

import (
	"bytes"
	"fmt"
	"strings"
)

// A parked message stays in the outbox table, whole, until it is redriven
// or purged: for as long as nobody looks, readable by whoever can read the
// table (and shown by `effectively outbox list`). RelayConfig.Redact and
// LogRelayConfig.Redact decide what of it a parked row keeps.

// redacted is what a parked row keeps of a message under Redact: its
// value, and its headers encoded as the table holds them.
type redacted struct {
	value   []byte
	headers []byte
}

// redactParked runs redact on a copy of m, and returns what the parked row
// keeps. What names and places the message (Sink, Key, ID) is not
// Redact's to change: a redriven message keeps its key's order and the ID
// the next stage dedupes by. It returns an error, and nothing to keep,
// when redact panics or returns a header no message may carry; the caller
// must then not park the row.
func redactParked(redact func(Message) Message, m Message) (_ *redacted, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("outbox: Redact panicked: %v", p)
		}
	}()
	in := Message{Sink: m.Sink, Key: bytes.Clone(m.Key), Value: bytes.Clone(m.Value), ID: m.ID}
	for _, h := range m.Headers {
		in.Headers = append(in.Headers, Header{Key: h.Key, Value: bytes.Clone(h.Value)})
	}
	out := redact(in)
	for _, h := range out.Headers {
		if h.Key == "" || checkText(h.Key) != "" || strings.EqualFold(h.Key, IDHeader) {
			return nil, fmt.Errorf("outbox: Redact returned a header named %q, which a message cannot carry", h.Key)
		}
	}
	return &redacted{value: out.Value, headers: encodeHeaders(out.Headers)}, nil
}
