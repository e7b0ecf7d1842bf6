package kafka

import (
	"strconv"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
)

// SourceName is Message.Source for messages of this package.
const SourceName = "kafka"

// delivery is a message together with where it came from; Message.SourceData
// points back to it.
type delivery struct {
	msg    consumer.Message
	lane   *lane
	offset int64
}

func laneName(topic string, partition int) string {
	return topic + "/" + strconv.Itoa(partition)
}

// newDelivery converts a record of l. Its ID is the idHeader's value when
// present and not empty, else "topic/partition/offset". Key, Value and
// header values are kept as the record has them: nil for a null, a non-nil
// empty slice for an empty one.
func newDelivery(l *lane, r *fetchedRecord, idHeader string) *delivery {
	d := &delivery{lane: l, offset: r.offset}
	recordMessage(&d.msg, l.name, r, idHeader)
	d.msg.SourceData = d
	return d
}

// recordMessage fills m from record r of lane, as the Source delivers it.
func recordMessage(m *consumer.Message, lane string, r *fetchedRecord, idHeader string) {
	m.Key = r.key
	m.Value = r.value
	m.Time = r.time
	m.Source = SourceName
	m.Lane = lane
	off := strconv.FormatInt(r.offset, 10)
	m.Ref = lane + "@" + off
	m.Headers = r.headers
	for _, h := range r.headers {
		if h.Key == idHeader && len(h.Value) > 0 {
			m.ID = string(h.Value)
			break
		}
	}
	if m.ID == "" {
		m.ID = lane + "/" + off
	}
}

// Position returns the topic, partition and offset of a message delivered
// by a Source of this package; ok is false for other messages.
func Position(m *consumer.Message) (topic string, partition int, offset int64, ok bool) {
	d, ok := m.SourceData.(*delivery)
	if !ok || d == nil {
		return "", 0, 0, false
	}
	return d.lane.topic, d.lane.partition, d.offset, true
}

// SequenceKey returns a KeyFunc for the highwater strategy that reads the
// sender from the header senderHeader and its sequence number from
// seqHeader with highwater.HeaderKey, so the sequence text follows the one
// rule of highwater.ParseSeq (decimal digits only, at least 1, no sign or
// spaces). A message missing either header (an error matching
// highwater.ErrMissingHeader), or with a sequence number that does not
// parse (a *highwater.SeqError), is parked with that reason.
//
// Use it with highwater's Strict mode: a message handed back for a retry
// then holds its sender's later messages back as gaps until it commits. In
// Monotonic mode the later messages would move the mark past it, and its
// redelivery would count as a duplicate.
func SequenceKey(senderHeader, seqHeader string) consumer.KeyFunc {
	return func(m *consumer.Message) (dedupe.Key, error) {
		k, err := highwater.HeaderKey(m.Header, senderHeader, seqHeader)
		if err != nil {
			return dedupe.Key{}, err
		}
		k.ID = m.ID
		return k, nil
	}
}
