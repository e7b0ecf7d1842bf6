package franzsink

import (
	"errors"
	"fmt"
	"sync"

	"github.com/effectively-once/effectively/outbox"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Config is what New takes.
type Config struct {
	// Topic is the topic the sink writes to. Required.
	Topic string
	// Opts are the options of the sink's kgo client: the brokers
	// (kgo.SeedBrokers; kgo's default is localhost:9092), TLS
	// (kgo.DialTLSConfig), SASL (kgo.SASL), compression
	// (kgo.ProducerBatchCompression), the largest record batch
	// (kgo.ProducerBatchMaxBytes, which should not exceed the topic's
	// max.message.bytes), hooks and logging. Defaults to kgo's defaults,
	// the idempotent producer among them.
	//
	// New refuses options under which the client could report a record
	// produced that the broker did not acknowledge, or let a key's records
	// overtake one another: kgo.RequiredAcks(kgo.NoAck()),
	// kgo.DisableIdempotentWrite() with more than one produce request in
	// flight per broker, kgo.AllowIdempotentProduceCancellation(), a
	// partitioner that spreads one key over several partitions
	// (kgo.RoundRobinPartitioner, kgo.LeastBackupPartitioner,
	// kgo.StickyPartitioner), kgo.TransactionalID (the sink produces
	// outside transactions; the idempotent producer is what it needs),
	// and kgo.DefaultProduceTopicAlways naming another topic.
	//
	// The sink adds kgo.ManualFlushing: it buffers all of a call's records
	// before any is sent (see Sink).
	Opts []kgo.Opt
}

// Sink publishes outbox messages to a Kafka topic through franz-go. The
// message key is the record key; the ID goes in the outbox.IDHeader header
// after the message's own headers.
//
// Each Publish buffers all its records in the client before flushing them
// (the client flushes only when asked), so whatever the broker answers,
// franz-go settles a partition's records in the order they were produced:
// a batch the broker refuses for good fails with every record buffered
// behind it in its partition, so no later record of a key is written
// ahead of an earlier one that failed. A record the broker refuses as too
// large (max.message.bytes) is reported refused for good (outbox.Permanent)
// with the broker's error, and so are the records failed behind it; the
// relay then publishes those one at a time and parks only the one refused
// on its own. A message too large for the client's record batch
// (kgo.ProducerBatchMaxBytes) is refused without being sent.
//
// Publish calls are serialized. A Publish whose ctx ends before the broker
// answered returns the context's error for what was not settled: those
// records stay in the client and may still be written, after which the
// relay publishes them again (a duplicate the next stage drops by its ID,
// after the first occurrence).
type Sink struct {
	cl       *kgo.Client
	topic    string
	batchMax int64 // the largest record batch the client builds for topic
	maxRecs  int   // the most records the client buffers
	maxBytes int64 // the most bytes the client buffers; 0 is no limit

	mu sync.Mutex // serializes Publish
}

var _ outbox.Sink = (*Sink)(nil)

// New returns a Sink writing to cfg.Topic through a kgo client of its own,
// made with cfg.Opts. It does not connect: the first Publish does.
func New(cfg Config) (*Sink, error) {
	const prefix = "franzsink: New: "
	if cfg.Topic == "" {
		return nil, errors.New(prefix + "Config.Topic is required")
	}
	opts := append(append([]kgo.Opt(nil), cfg.Opts...), kgo.ManualFlushing())
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf(prefix+"%w", err)
	}
	if err := check(cl, cfg.Topic); err != nil {
		cl.Close()
		return nil, errors.New(prefix + err.Error())
	}
	s := &Sink{cl: cl, topic: cfg.Topic}
	s.batchMax = int64(cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32)(cfg.Topic))
	s.maxRecs = int(min(cl.OptValue(kgo.MaxBufferedRecords).(int64), 1<<20))
	s.maxBytes = cl.OptValue(kgo.MaxBufferedBytes).(int64)
	return s, nil
}

// check refuses a client that could report a record produced without the
// broker's acknowledgement, or reorder a key.
func check(cl *kgo.Client, topic string) error {
	idempotent := !cl.OptValue(kgo.DisableIdempotentWrite).(bool)
	switch {
	case cl.OptValue(kgo.RequiredAcks).(kgo.Acks) == kgo.NoAck():
		return errors.New("kgo.RequiredAcks(kgo.NoAck()) is refused: the broker would not answer, " +
			"and a record it refused (too large, say) would be marked published and lost; leave kgo's default (all in-sync replicas)")
	case !idempotent && cl.OptValue(kgo.MaxProduceRequestsInflightPerBroker).(int) > 1:
		return fmt.Errorf("kgo.DisableIdempotentWrite() with kgo.MaxProduceRequestsInflightPerBroker(%d) is refused: "+
			"without idempotence, a retried request can land behind the one sent after it and reorder a key; "+
			"keep the idempotent producer (kgo's default), or allow one request in flight",
			cl.OptValue(kgo.MaxProduceRequestsInflightPerBroker).(int))
	case idempotent && cl.OptValue(kgo.AllowIdempotentProduceCancellation).(bool):
		return errors.New("kgo.AllowIdempotentProduceCancellation() is refused: it fails records in flight " +
			"that may still be written, which could let a key's later record overtake them")
	case transactional(cl):
		return errors.New("kgo.TransactionalID is refused: the sink produces outside transactions " +
			"(each message carries the ID the next stage dedupes by); the idempotent producer, kgo's default, keeps a key's order")
	case cl.OptValue(kgo.DefaultProduceTopicAlways).(bool) && cl.OptValue(kgo.DefaultProduceTopic).(string) != topic:
		return fmt.Errorf("kgo.DefaultProduceTopicAlways sends every record to %q, not to Config.Topic %q",
			cl.OptValue(kgo.DefaultProduceTopic).(string), topic)
	}
	p, _ := cl.OptValue(kgo.RecordPartitioner).(kgo.Partitioner)
	if p != nil && !p.ForTopic(topic).RequiresConsistency(&kgo.Record{Topic: topic, Key: []byte("key")}) {
		return fmt.Errorf("the partitioner (%T) spreads one key over several partitions, which reorders the key: "+
			"leave kgo's default (UniformBytesPartitioner hashing keys), or use kgo.StickyKeyPartitioner", p)
	}
	return nil
}

// transactional reports whether the client was given a transactional ID.
func transactional(cl *kgo.Client) bool {
	vs := cl.OptValues(kgo.TransactionalID)
	set, _ := vs[len(vs)-1].(bool)
	return len(vs) == 2 && set
}

// Close closes the sink's client. Records a Publish gave up on and that
// are still buffered are failed.
func (s *Sink) Close() { s.cl.Close() }

// classify marks the broker's refusals that a retry cannot change, as
// outbox.KafkaSink does. An unknown topic counts as one: a sink names a
// topic that should exist, and a message parked while it did not is
// redriven once it does. Unlike kafka-go's Transport, kgo never answers
// "unknown topic" from a cache: it reads metadata again for a topic it
// does not know, and fails records with UNKNOWN_TOPIC_OR_PARTITION only
// after more than kgo.UnknownTopicRetries such answers in a row (see
// sinktest's TopicCreatedLater and UnknownTopicFromBroker).
func classify(err error) error {
	if err == nil || outbox.IsPermanent(err) {
		return err
	}
	for _, p := range []*kerr.Error{kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.InvalidTopicException,
		kerr.TopicAuthorizationFailed, kerr.InvalidRecord, kerr.UnknownTopicOrPartition} {
		if errors.Is(err, p) {
			return outbox.Permanent(err)
		}
	}
	return err
}
