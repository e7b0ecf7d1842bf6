package consumer

import (
	"time"

	"github.com/effectively-once/effectively/dedupe"
)

// Header is one message header (a Kafka header, an SQS message attribute).
type Header struct {
	Key   string
	Value []byte
}

// Message is one delivery of a message from a Source.
type Message struct {
	// Key is the broker's message key (a Kafka record key); it may be nil. It
	// is not the dedupe key: see DedupeKey.
	Key []byte
	// Value is the payload.
	Value []byte
	// Headers are the message's headers or attributes.
	Headers []Header
	// Time is when the broker accepted the message, if it says.
	Time time.Time

	// Source names the kind of source ("kafka", "sqs", …).
	Source string
	// Lane is the ordered stream the message came from: a Kafka
	// topic/partition, an SQS receiver or FIFO message group. Messages of one
	// lane are handled in order.
	Lane string
	// Ref locates this message in its source, such as "orders/3@1042" for a
	// Kafka offset or an SQS MessageId. It is stable across redeliveries of
	// the same stored message, unique among the messages a source holds,
	// and kept, byte for byte, with parked messages. See Source.
	Ref string
	// Attempt counts deliveries of this message, this one included, so it
	// starts at 1; whether it survives a restart depends on the broker. See
	// Source.
	Attempt int

	// ID is the source's default dedupe ID (an idempotency-key header, a
	// Kafka topic/partition/offset, an SQS MessageId…). The default KeyFunc
	// uses it.
	ID string
	// DedupeKey is the key the consumer derived with its KeyFunc. It is set
	// before the handler runs.
	DedupeKey dedupe.Key

	// SourceData belongs to the Source that delivered the message (a receipt
	// handle, an offset); the consumer never reads it.
	SourceData any
}

// Header returns the value of the first header named key, and whether it exists.
func (m *Message) Header(key string) ([]byte, bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return h.Value, true
		}
	}
	return nil, false
}
