package franz

import (
	"strconv"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
)

// SourceName is Message.Source for messages of this package. It is
// sources/kafka's, so that what depends on it (hooks, dashboards, parked
// rows) treats a group's messages alike whichever client read them.
const SourceName = kafka.SourceName

// TopicPartition names one partition of a topic.
type TopicPartition = kafka.TopicPartition

// delivery is a message together with where it came from; Message.SourceData
// points back to it.
type delivery struct {
	msg    consumer.Message
	lane   *lane
	offset int64
}

func offsetOf(m *consumer.Message) int64 { return m.SourceData.(*delivery).offset }

func laneName(topic string, partition int) string {
	return topic + "/" + strconv.Itoa(partition)
}

// newDelivery converts record r of l. Its ID is the idHeader's value when
// present and not empty, else "topic/partition/offset". Key, Value and
// header values are kept as franz-go decoded them: nil for a null, a
// non-nil empty slice for an empty one.
func newDelivery(l *lane, r *kgo.Record, idHeader string) *delivery {
	d := &delivery{lane: l, offset: r.Offset}
	m := &d.msg
	m.Key = r.Key
	m.Value = r.Value
	m.Time = r.Timestamp
	m.Source = SourceName
	m.Lane = l.name
	off := strconv.FormatInt(r.Offset, 10)
	m.Ref = l.name + "@" + off
	if len(r.Headers) > 0 {
		m.Headers = make([]consumer.Header, len(r.Headers))
		for i, h := range r.Headers {
			m.Headers[i] = consumer.Header{Key: h.Key, Value: h.Value}
			if m.ID == "" && h.Key == idHeader && len(h.Value) > 0 {
				m.ID = string(h.Value)
			}
		}
	}
	if m.ID == "" {
		m.ID = l.name + "/" + off
	}
	m.SourceData = d
	return d
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

// SequenceKey returns a KeyFunc for the highwater strategy reading the
// sender and its sequence number from headers, as sources/kafka's
// SequenceKey does (see there).
func SequenceKey(senderHeader, seqHeader string) consumer.KeyFunc {
	return kafka.SequenceKey(senderHeader, seqHeader)
}
