package parked

import (
	"fmt"
	"time"

	"github.com/effectively-once/effectively/dedupe"
)

// Reasons a message is parked, stored in the parked table's reason column.
const (
	// ReasonInvalidKey: no usable dedupe key (missing, empty, too long, not
	// valid text, or the KeyFunc failed).
	ReasonInvalidKey = "invalid_key"
	// ReasonPermanent: the handler returned a permanent error (see
	// consumer.Permanent), such as a payload it cannot decode.
	ReasonPermanent = "permanent"
	// ReasonMaxAttempts: the handler failed consumer.Config.MaxAttempts
	// times.
	ReasonMaxAttempts = "max_attempts"
	// ReasonMismatch: the key was processed before with another payload, and
	// consumer.Config.OnMismatch is consumer.MismatchPark.
	ReasonMismatch = "mismatch"
	// ReasonGap: the message waited consumer.Config.GapMaxAttempts
	// deliveries for an earlier sequence number that never came.
	ReasonGap = "gap"
)

// Header is one header of a parked message, as the message carried it (a
// consumer.Header).
type Header struct {
	Key   string
	Value []byte
}

// Row is one row of the parked table: a message kept whole, why it was
// parked and how often. Store reads and writes it; it is the one shape of
// a parked message in the library.
type Row struct {
	// ID is the row's id, given by the table; it orders rows as they were
	// first parked. Ignored by InsertTx.
	ID int64
	// Consumer is the name of the consumer that parked the message.
	Consumer string
	// Scope is the dedupe scope the message belongs to.
	Scope string

	// The dedupe key, when the message had a valid one: DedupeID or Sender
	// is not nil. Both nil: the message was parked without a key
	// (ReasonInvalidKey).
	DedupeID    *string
	Sender      *string
	Seq         *int64
	Fingerprint []byte
	// HasMarker is true when a dedupe marker was written with the row: a
	// redelivery of the message is then a duplicate, and a redrive applies
	// it without claiming the key again.
	HasMarker bool

	// The message, exactly as delivered: Source, Lane and Ref byte for
	// byte, MsgKey and Payload nil when the message had none (a Kafka
	// tombstone) and empty when empty.
	Source      string
	Lane        string
	Ref         string
	MsgKey      []byte
	Payload     []byte
	Headers     []Header
	MessageTime time.Time // zero when the source did not say

	// Attempts is how many deliveries failed before the message was parked
	// (and redrives after).
	Attempts int
	// Reason is one of the Reason* constants; LastError the newest error.
	Reason    string
	LastError string
	// ParkCount is how many times this message was parked: the same
	// message (same scope, source, ref, key, payload and headers) parked
	// again shares its row. InsertTx takes 0 as 1.
	ParkCount int
	// ParkedAt is when the message was first parked, LastParkedAt the
	// latest time. Set by the table.
	ParkedAt     time.Time
	LastParkedAt time.Time
}

// HasKey reports whether the message was parked with a dedupe key.
func (p *Row) HasKey() bool { return p.DedupeID != nil || p.Sender != nil }

// DedupeKey returns the message's dedupe key, and false when it was parked
// without one.
func (p *Row) DedupeKey() (dedupe.Key, bool) {
	if !p.HasKey() {
		return dedupe.Key{}, false
	}
	k := dedupe.Key{Scope: p.Scope, Fingerprint: p.Fingerprint}
	if p.DedupeID != nil {
		k.ID = *p.DedupeID
	}
	if p.Sender != nil {
		k.Sender = *p.Sender
	}
	if p.Seq != nil {
		k.Seq = *p.Seq
	}
	return k, true
}

// HeadersJSON returns the headers as the table stores them: a JSON array
// of {"key", "value"} objects, where a key or value that is not valid text
// is in "key_base64" or "value_base64" and a nil value is "null": true.
func (p *Row) HeadersJSON() []byte { return []byte(encodeHeaders(p.Headers)) }

func (p Row) String() string {
	id := "<nil>"
	if p.DedupeID != nil {
		id = fmt.Sprintf("%q", *p.DedupeID)
	}
	return fmt.Sprintf("{ID:%d DedupeID:%s Reason:%s LastError:%q Payload:%q Ref:%q Source:%q Lane:%q Attempts:%d ParkCount:%d HasMarker:%v}",
		p.ID, id, p.Reason, p.LastError, p.Payload, p.Ref, p.Source, p.Lane, p.Attempts, p.ParkCount, p.HasMarker)
}
