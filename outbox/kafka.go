package outbox

import (
	"context"
	"errors"

	kafkago "github.com/segmentio/kafka-go"
)

// KafkaSink publishes to a Kafka topic through a kafka-go Writer. The
// message key is the Kafka key; the ID goes in the IDHeader header.
type KafkaSink struct {
	w *kafkago.Writer
}

var _ Sink = (*KafkaSink)(nil)

// NewKafkaSink returns a Sink writing with w, which must name its Topic and
// be synchronous (Async false), so that the relay learns what was written.
// For order, w.Balancer must send one key to one partition (kafka-go's
// default, RoundRobin, does not: use kafka.Hash or kafka.Murmur2Balancer),
// and w.BatchSize should be at least the relay's BatchSize, so that one
// Publish is one produce request per partition and a failure fails a key's
// later messages with it.
func NewKafkaSink(w *kafkago.Writer) (*KafkaSink, error) {
	switch {
	case w == nil:
		return nil, errors.New("outbox: NewKafkaSink: nil Writer")
	case w.Topic == "":
		return nil, errors.New("outbox: NewKafkaSink: the Writer must name its Topic")
	case w.Async:
		return nil, errors.New("outbox: NewKafkaSink: the Writer must not be Async")
	}
	return &KafkaSink{w: w}, nil
}

// Publish writes msgs and reports, per message, what failed.
func (s *KafkaSink) Publish(ctx context.Context, msgs []Message) error {
	kms := make([]kafkago.Message, len(msgs))
	for i, m := range msgs {
		hs := make([]kafkago.Header, 0, len(m.Headers)+1)
		for _, h := range m.Headers {
			hs = append(hs, kafkago.Header{Key: h.Key, Value: h.Value})
		}
		hs = append(hs, kafkago.Header{Key: IDHeader, Value: []byte(m.ID)})
		kms[i] = kafkago.Message{Key: m.Key, Value: m.Value, Headers: hs}
	}
	err := s.w.WriteMessages(ctx, kms...)
	if err == nil {
		return nil
	}
	var we kafkago.WriteErrors
	if errors.As(err, &we) {
		out := PublishErrors{}
		for i, e := range we {
			if e != nil {
				out[i] = classifyKafka(e)
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	}
	return classifyKafka(err)
}

// classifyKafka marks the broker's refusals that a retry cannot change.
// An unknown topic counts as one: a sink names a topic that should exist,
// and a message parked while it did not is redriven once it does.
func classifyKafka(err error) error {
	var tooLarge kafkago.MessageTooLargeError
	if errors.As(err, &tooLarge) {
		return Permanent(err)
	}
	var ke kafkago.Error
	if errors.As(err, &ke) {
		switch ke {
		case kafkago.MessageSizeTooLarge, kafkago.RecordListTooLarge, kafkago.InvalidTopic,
			kafkago.TopicAuthorizationFailed, kafkago.InvalidRecord,
			kafkago.UnknownTopicOrPartition:
			return Permanent(err)
		}
	}
	return err
}
