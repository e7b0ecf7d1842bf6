package outbox

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/effectively-once/effectively/consumer"
)

// IDHeader is the header (Kafka) the relay sends a message's ID in. It is
// the header sources/kafka and the attribute sources/sqs take as their
// default dedupe ID, so the next stage drops a relay's duplicates with no
// configuration.
const IDHeader = "idempotency-key"

// Header is one message header.
type Header = consumer.Header

// Message is one message to publish.
type Message struct {
	// Sink names the destination, one of the relay's Config.Sinks (a Kafka
	// topic, for example). Required.
	Sink string
	// Key is the message key: the Kafka record key. Messages of one (Sink,
	// Key) are published in the order their transactions committed. A nil
	// Key has no order: such messages are published in any order.
	Key []byte
	// Value is the payload. A nil Value stays nil (a Kafka tombstone); an
	// empty one stays empty.
	Value []byte
	// Headers are sent with the message. Their names must be non-empty,
	// valid UTF-8, and not IDHeader (set ID instead).
	Headers []Header
	// ID is sent as the IDHeader header, for the next stage to dedupe by.
	// EmitFor derives it from the input when empty (see ID); Emit makes a
	// random one when empty.
	ID string
}

// ID returns the ID of the ordinal-th message (counting from 0) emitted
// while applying the input in. It is derived from the input's dedupe key
// (its scope included), which the consumer sets before the handler runs,
// so applying the same input again, in the same scope, gives the same IDs,
// and recomputing it into another scope gives other ones.
func ID(in *consumer.Message, ordinal int) string {
	k := in.DedupeKey
	h := sha256.New()
	for _, s := range []string{k.Scope, k.ID, k.Sender, strconv.FormatInt(k.Seq, 10), strconv.Itoa(ordinal)} {
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	return "ob1-" + hex.EncodeToString(h.Sum(nil)[:16])
}

func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "ob0-" + hex.EncodeToString(b)
}

// ErrInvalid is wrapped by every error Emit returns for a message it refuses.
var ErrInvalid = errors.New("outbox: invalid message")

// MessageError says why Emit refused a message.
type MessageError struct {
	// Index is the message's position in the call to Emit.
	Index  int
	Sink   string
	Reason string
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("outbox: message %d to sink %q: %s", e.Index, e.Sink, e.Reason)
}

// Unwrap returns ErrInvalid.
func (e *MessageError) Unwrap() error { return ErrInvalid }

// size is what the message weighs on the wire, roughly.
func (m *Message) size() int {
	n := len(m.Key) + len(m.Value) + len(m.ID) + len(IDHeader)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

func checkText(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case len(s) > 0 && containsNUL(s):
		return "contains a NUL byte"
	}
	return ""
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// encodeHeaders packs headers into one bytea: for each, the name's length
// and the name, then 0 for a nil value or the value's length + 1 and the
// value. nil for no headers.
func encodeHeaders(hs []Header) []byte {
	if len(hs) == 0 {
		return nil
	}
	var b []byte
	for _, h := range hs {
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		if h.Value == nil {
			b = binary.AppendUvarint(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(h.Value))+1)
		b = append(b, h.Value...)
	}
	return b
}

func decodeHeaders(b []byte) ([]Header, error) {
	var hs []Header
	for len(b) > 0 {
		n, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < n {
			return nil, errors.New("outbox: corrupt headers")
		}
		name := string(b[k : k+int(n)])
		b = b[k+int(n):]
		n, k = binary.Uvarint(b)
		if k <= 0 || (n > 0 && uint64(len(b)-k) < n-1) {
			return nil, errors.New("outbox: corrupt headers")
		}
		b = b[k:]
		var v []byte
		if n > 0 {
			v = append([]byte{}, b[:n-1]...)
			b = b[n-1:]
		}
		hs = append(hs, Header{Key: name, Value: v})
	}
	return hs, nil
}
