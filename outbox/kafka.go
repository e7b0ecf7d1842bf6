package outbox

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// Defaults KafkaSink takes where the Writer leaves a setting zero, as
// kafka-go's Writer does.
const (
	kafkaDefaultBatchSize  = 100
	kafkaDefaultBatchBytes = 1 << 20
	kafkaDefaultAttempts   = 10
	kafkaDefaultBackoffMin = 100 * time.Millisecond
	kafkaDefaultBackoffMax = time.Second
	kafkaDefaultTimeout    = 10 * time.Second
	kafkaRecordOverhead    = 24 // a record's framing in a batch, roughly
	kafkaHeaderOverhead    = 2
)

// errBehind is the error of a message not sent because an earlier message
// of its key failed in the same Publish.
var errBehind = errors.New("outbox: not sent: an earlier message of its key failed")

// KafkaSink publishes to a Kafka topic. The message key is the Kafka key;
// the ID goes in the IDHeader header.
//
// It sends its own produce requests, one partition each, through the
// Writer's Transport, rather than through kafka-go's Writer, so that it
// decides how a key's messages are cut into requests and when one may
// follow another (kafka-go's Writer sends a partition's batches one after
// the other whether or not the one before failed, and batches concurrent
// callers' messages together):
//
//   - Nothing is reported published that the broker did not acknowledge:
//     the sink refuses a Writer that does not wait for acknowledgements.
//   - Per partition, one request of a Publish is in flight at a time, and
//     a key's messages go out in order. Once a request fails (after its
//     attempts), none of its keys' later messages is sent: they are
//     reported as not sent, and the relay publishes them again after the
//     failed one. So a key's first occurrences in the topic keep commit
//     order whatever the request sizes and the broker's failures.
//   - A request the broker refuses as too large (MESSAGE_TOO_LARGE,
//     RECORD_LIST_TOO_LARGE) that holds several messages is cut in half
//     and sent again, and the sink sends smaller requests from then on: a
//     topic whose max.message.bytes is below BatchBytes costs a few
//     refused requests, not a message. A message refused on its own is
//     refused for good (Permanent), and the relay parks it.
//
// Retries within a Publish are of the same request, in place, so they keep
// order; a duplicate they cause (a request that timed out after the broker
// appended it) comes after the first occurrence, and the next stage drops
// it by its ID.
type KafkaSink struct {
	client      *kafkago.Client
	topic       string
	balancer    kafkago.Balancer
	acks        kafkago.RequiredAcks
	compression kafkago.Compression
	autoCreate  bool
	maxMsgs     int
	batchBytes  int64        // the Writer's BatchBytes: no message may be larger
	maxBytes    atomic.Int64 // the most bytes a request carries, lowered when the broker refuses a request as too large
	attempts    int
	backoffMin  time.Duration
	backoffMax  time.Duration
	readTimeout time.Duration
	logger      kafkago.Logger // the Writer's Logger; nil logs nothing

	metaMu  sync.Mutex    // one recheckTopic at a time
	metaGen atomic.Uint64 // how often recheckTopic reset the Transport's cache
}

var _ Sink = (*KafkaSink)(nil)

// NewKafkaSink returns a Sink writing to w.Topic with w's settings. w is
// read once, for its settings; the sink does not write through it (see
// KafkaSink), so its Stats stay empty, and closing it is harmless.
//
// What it takes from w:
//   - Addr, Topic (both required), Transport (TLS, SASL; nil is kafka-go's
//     DefaultTransport), AllowAutoTopicCreation, Compression.
//   - RequiredAcks: kafka.RequireAll (recommended) or kafka.RequireOne.
//     RequireNone, kafka-go's zero value, is refused: the broker would not
//     answer, and a message it refused (too large, say) would be reported
//     published and lost.
//   - Balancer: it must send one key to one partition, or the topic itself
//     reorders a key. kafka.Hash, kafka.Murmur2Balancer (Java's
//     partitioner), kafka.CRC32Balancer or a balancer of your own; nil
//     (kafka-go's round robin), kafka.RoundRobin and kafka.LeastBytes are
//     refused.
//   - BatchSize and BatchBytes: the most messages and bytes in one request
//     (default 100 and 1 MiB, as kafka-go's). As with kafka-go's Writer, a
//     message larger than BatchBytes is refused without being sent, for
//     good (Permanent): set BatchBytes to the topic's max.message.bytes to
//     park such messages without a round trip.
//   - MaxAttempts, WriteBackoffMin, WriteBackoffMax: how often a failed
//     request is tried again in place, and the wait between tries (default
//     10, 100 ms, 1 s). A request that still fails is reported failed, and
//     the relay tries its messages again later, with its own backoff.
//   - WriteTimeout, ReadTimeout: the time a produce request and a metadata
//     request may take (default 10 s each).
//   - Logger: where the sink says it found the Transport's cached metadata
//     stale (nil, kafka-go's default, logs nothing).
//
// An unknown topic is refused for good (the relay parks the message) only
// when the broker, asked afresh, does not list it: not on the word of the
// Transport's cached metadata (kafka-go refreshes it every MetadataTTL),
// which does not know a topic created after it was read, nor on a broker
// whose metadata lags. When the broker lists the topic, the sink resets the
// Transport's cache (CloseIdleConnections, which also closes its idle
// connections; a Transport shared with other clients shares the reset) and
// sends again. A Transport whose MetadataTopics leaves out the Topic is
// refused.
//
// Async and Completion are refused: the sink reports each message's
// outcome to the relay as the broker acknowledges it, and would never call
// Completion. BatchTimeout is not used: the sink sends at once.
func NewKafkaSink(w *kafkago.Writer) (*KafkaSink, error) {
	const prefix = "outbox: NewKafkaSink: "
	switch {
	case w == nil:
		return nil, errors.New(prefix + "nil Writer")
	case w.Addr == nil:
		return nil, errors.New(prefix + "the Writer must name its brokers (Addr)")
	case w.Topic == "":
		return nil, errors.New(prefix + "the Writer must name its Topic")
	case w.Async:
		return nil, errors.New(prefix + "the Writer must not be Async: a message is marked published only once the broker acknowledged it")
	case w.Completion != nil:
		return nil, errors.New(prefix + "the Writer must have no Completion: the sink reports each message's outcome to the relay and would never call it")
	case w.RequiredAcks == kafkago.RequireNone:
		return nil, errors.New(prefix + "the Writer's RequiredAcks is RequireNone (kafka-go's zero value), under which the broker does not answer " +
			"and a message it refuses would be marked published and lost: set RequiredAcks: kafka.RequireAll")
	case w.RequiredAcks != kafkago.RequireOne && w.RequiredAcks != kafkago.RequireAll:
		return nil, fmt.Errorf(prefix+"the Writer's RequiredAcks is %d: use kafka.RequireAll (or kafka.RequireOne)", int(w.RequiredAcks))
	}
	if t, ok := w.Transport.(*kafkago.Transport); ok && len(t.MetadataTopics) > 0 && !slices.Contains(t.MetadataTopics, w.Topic) {
		return nil, fmt.Errorf(prefix+"the Writer's Transport caches the metadata of %v only (MetadataTopics), not of its Topic %q, "+
			"so it could never route a message to it: add the Topic, or leave MetadataTopics empty", t.MetadataTopics, w.Topic)
	}
	switch w.Balancer.(type) {
	case nil, *kafkago.RoundRobin, *kafkago.LeastBytes:
		return nil, fmt.Errorf(prefix+"the Writer's Balancer (%s) spreads one key over several partitions, which reorders the key: "+
			"use &kafka.Hash{} (or kafka.Murmur2Balancer, Java's partitioner)", balancerName(w.Balancer))
	}
	s := &KafkaSink{
		client:      &kafkago.Client{Addr: w.Addr, Transport: w.Transport, Timeout: orDefault(w.WriteTimeout, kafkaDefaultTimeout)},
		topic:       w.Topic,
		balancer:    w.Balancer,
		acks:        w.RequiredAcks,
		compression: w.Compression,
		autoCreate:  w.AllowAutoTopicCreation,
		maxMsgs:     w.BatchSize,
		attempts:    w.MaxAttempts,
		backoffMin:  orDefault(w.WriteBackoffMin, kafkaDefaultBackoffMin),
		backoffMax:  orDefault(w.WriteBackoffMax, kafkaDefaultBackoffMax),
		readTimeout: orDefault(w.ReadTimeout, kafkaDefaultTimeout),
		logger:      w.Logger,
	}
	if s.maxMsgs <= 0 {
		s.maxMsgs = kafkaDefaultBatchSize
	}
	if s.attempts <= 0 {
		s.attempts = kafkaDefaultAttempts
	}
	s.backoffMax = max(s.backoffMax, s.backoffMin)
	s.batchBytes = kafkaDefaultBatchBytes
	if w.BatchBytes > 0 {
		s.batchBytes = w.BatchBytes
	}
	s.maxBytes.Store(s.batchBytes)
	return s, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func balancerName(b kafkago.Balancer) string {
	if b == nil {
		return "nil, kafka-go's round robin"
	}
	return fmt.Sprintf("%T", b)
}

// classifyKafka marks the broker's refusals that a retry cannot change.
//
// An unknown topic is not among them here, since it may be only the
// Transport's cached metadata, read before the topic was created, or a
// broker whose metadata lags: recheckTopic asks the broker afresh, and a
// topic it does not list is refused for good there (Permanent), so that
// the relay parks the message. A sink names a topic that should exist, and
// a message parked while it did not is redriven once it does; a message
// whose topic exists is never parked for an unknown topic.
func classifyKafka(err error) error {
	if err == nil || IsPermanent(err) {
		return err
	}
	var tooLarge kafkago.MessageTooLargeError
	if errors.As(err, &tooLarge) {
		return Permanent(err)
	}
	var ke kafkago.Error
	if errors.As(err, &ke) {
		switch ke {
		case kafkago.MessageSizeTooLarge, kafkago.RecordListTooLarge, kafkago.InvalidTopic,
			kafkago.TopicAuthorizationFailed, kafkago.InvalidRecord:
			return Permanent(err)
		}
	}
	return err
}
