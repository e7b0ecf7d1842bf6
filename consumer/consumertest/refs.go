package consumertest

import (
	"bytes"
	"fmt"

	"github.com/effectively-once/effectively/consumer"
)

// binarySuffixes end the refs of Config.BinaryRefs: a NUL byte, a byte that
// is never valid UTF-8, an overlong encoding of NUL and an encoded UTF-16
// surrogate. All four are one run of "invalid" bytes to a text column or to
// strings.ToValidUTF8, so refs that differ only in them collide as soon as
// anything makes them valid text.
var binarySuffixes = [...]string{"\x00", "\xff", "\xc0\x80", "\xed\xa0\x80"}

// Ref returns the ref a Broker gives the message at offset of lane:
// "lane-0@12", or with binary refs "lane-0@3" followed by one of four
// suffixes of NUL or invalid UTF-8 bytes picked by offset%4 (offset 12 is
// "lane-0@3\x00", 13 is "lane-0@3\xff").
func Ref(lane string, offset int, binary bool) string {
	if !binary {
		return fmt.Sprintf("%s@%d", lane, offset)
	}
	return fmt.Sprintf("%s@%d%s", lane, offset/len(binarySuffixes), binarySuffixes[offset%len(binarySuffixes)])
}

// delivery returns a fresh copy of the stored message, so that a handler
// that changes a delivery changes nothing else. Nil stays nil and empty
// stays empty, in the value, the key and each header value.
func (e *entry) delivery() consumer.Message {
	m := e.tmpl
	m.Key = bytes.Clone(m.Key)
	m.Value = bytes.Clone(m.Value)
	if m.Headers != nil {
		m.Headers = make([]consumer.Header, len(e.tmpl.Headers))
		for i, h := range e.tmpl.Headers {
			m.Headers[i] = consumer.Header{Key: h.Key, Value: bytes.Clone(h.Value)}
		}
	}
	return m
}

// Pending is a published message that has not been acknowledged.
type Pending struct {
	// Message is the stored message as it is delivered (without Attempt).
	Message consumer.Message
	// Deliveries counts its deliveries so far.
	Deliveries int
	// InFlight is true when it is part of a batch fetched and not yet settled.
	InFlight bool
}

// Pending returns every message not yet acknowledged, lane by lane in log
// order: what a stuck test is waiting for.
func (b *Broker) Pending() []Pending {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []Pending
	for _, l := range b.lanes {
		inflight := map[*entry]bool{}
		if batch := b.sched.Lane(l.name).InFlight; batch != nil {
			for _, m := range batch.Messages {
				inflight[m.SourceData.(*entry)] = true
			}
		}
		for _, e := range l.log {
			if !e.acked {
				out = append(out, Pending{Message: e.delivery(), Deliveries: e.deliveries, InFlight: inflight[e]})
			}
		}
	}
	return out
}
