package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
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

// Publish writes msgs and reports, per message, what failed.
func (s *KafkaSink) Publish(ctx context.Context, msgs []Message) error {
	if len(msgs) == 0 {
		return nil
	}
	n, err := s.partitions(ctx)
	if err != nil {
		return classifyKafka(err)
	}
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	out := make([]outMsg, len(msgs))
	byPart := map[int][]int{}
	var order []int
	for i := range msgs {
		m := &out[i]
		m.km = kafkaMessage(&msgs[i])
		m.size = recordSize(&m.km)
		if m.size > s.batchBytes {
			m.err = Permanent(fmt.Errorf("outbox: the message is about %d bytes, over the Writer's BatchBytes (%d): %w", m.size, s.batchBytes, kafkago.MessageSizeTooLarge))
		}
		p := s.balancer.Balance(m.km, parts...)
		if p < 0 || p >= n {
			return Permanent(fmt.Errorf("outbox: the Balancer chose partition %d of %d", p, n))
		}
		if _, ok := byPart[p]; !ok {
			order = append(order, p)
		}
		byPart[p] = append(byPart[p], i)
	}
	errs := make([]error, len(msgs))
	if len(order) == 1 {
		s.sendPartition(ctx, order[0], out, byPart[order[0]], errs)
	} else {
		var wg sync.WaitGroup
		for _, p := range order {
			wg.Go(func() { s.sendPartition(ctx, p, out, byPart[p], errs) })
		}
		wg.Wait()
	}
	pe := PublishErrors{}
	for i, e := range errs {
		if e != nil {
			pe[i] = e
		}
	}
	if len(pe) == 0 {
		return nil
	}
	return pe
}

// outMsg is a message on its way to Kafka.
type outMsg struct {
	km   kafkago.Message
	size int64
	err  error // refused before sending
}

func kafkaMessage(m *Message) kafkago.Message {
	hs := make([]kafkago.Header, 0, len(m.Headers)+1)
	for _, h := range m.Headers {
		hs = append(hs, kafkago.Header{Key: h.Key, Value: h.Value})
	}
	hs = append(hs, kafkago.Header{Key: IDHeader, Value: []byte(m.ID)})
	return kafkago.Message{Key: m.Key, Value: m.Value, Headers: hs}
}

// recordSize is about what m weighs in a record batch.
func recordSize(m *kafkago.Message) int64 {
	n := kafkaRecordOverhead + len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += kafkaHeaderOverhead + len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// sendPartition sends the messages at idx (in order) to partition p in
// requests of at most maxMsgs messages and maxBytes bytes, one at a time.
// Once a request fails, the later messages of its keys are not sent.
func (s *KafkaSink) sendPartition(ctx context.Context, p int, out []outMsg, idx []int, errs []error) {
	failedAt := map[string]int{} // per key, the index of its first failed message
	stop := func(i int, err error) {
		errs[i] = err
		if k := out[i].km.Key; k != nil {
			if j, ok := failedAt[string(k)]; !ok || i < j {
				failedAt[string(k)] = i
			}
		}
	}
	behind := func(i int) bool {
		k := out[i].km.Key
		j, ok := failedAt[string(k)]
		return k != nil && ok && i > j
	}
	for len(idx) > 0 {
		if err := ctx.Err(); err != nil {
			for _, i := range idx {
				errs[i] = err
			}
			return
		}
		maxBytes := s.maxBytes.Load()
		var req []int
		var size int64
		j := 0
		for ; j < len(idx); j++ {
			i := idx[j]
			if behind(i) {
				errs[i] = errBehind
				continue
			}
			if out[i].err != nil {
				stop(i, out[i].err)
				continue
			}
			if len(req) == s.maxMsgs || (len(req) > 0 && size+out[i].size > maxBytes) {
				break
			}
			req = append(req, i)
			size += out[i].size
		}
		if len(req) == 0 {
			return
		}
		err := s.produce(ctx, p, out, req)
		switch {
		case err == nil:
			idx = idx[j:]
		case len(req) > 1 && tooLarge(err):
			// Cut the request in half and send it again, and send no
			// request this large from now on.
			half := max(size/2, 1)
			for cur := s.maxBytes.Load(); half < cur && !s.maxBytes.CompareAndSwap(cur, half); cur = s.maxBytes.Load() {
			}
		default:
			for _, i := range req {
				stop(i, err)
			}
			idx = idx[j:]
		}
	}
}

// tooLarge reports whether the broker refused a request for its size.
func tooLarge(err error) bool {
	var ke kafkago.Error
	return errors.As(err, &ke) && (ke == kafkago.MessageSizeTooLarge || ke == kafkago.RecordListTooLarge)
}

// produce sends the messages at req to partition p in one request, tried
// again in place up to the attempts allowed while the error is one a retry
// can cure, and returns the last error, classified.
func (s *KafkaSink) produce(ctx context.Context, p int, out []outMsg, req []int) error {
	var err error
	for attempt := range s.attempts {
		if attempt > 0 {
			t := time.NewTimer(kafkaBackoff(s.backoffMin, s.backoffMax, attempt))
			select {
			case <-ctx.Done():
				t.Stop()
				return err
			case <-t.C:
			}
		}
		var res *kafkago.ProduceResponse
		res, err = s.client.Produce(ctx, &kafkago.ProduceRequest{
			Topic: s.topic, Partition: p, RequiredAcks: s.acks, Compression: s.compression,
			Records: &outRecords{out: out, idx: req},
		})
		switch {
		case err != nil:
		case res == nil:
			err = errors.New("outbox: the broker did not acknowledge the request")
		default:
			err = res.Error
		}
		if err == nil {
			return nil
		}
		err = classifyKafka(err)
		if IsPermanent(err) || tooLarge(err) || ctx.Err() != nil || !retriable(err) {
			return err
		}
	}
	return err
}

// retriable reports whether a failed request may succeed if sent again at
// once: the broker's temporary errors, and the network's.
func retriable(err error) bool {
	var ke kafkago.Error
	if errors.As(err, &ke) {
		return ke.Temporary()
	}
	return true // a network error or a timeout: the request may not have arrived
}

// kafkaBackoff doubles from minD with each attempt, up to maxD.
func kafkaBackoff(minD, maxD time.Duration, attempt int) time.Duration {
	d := minD
	for i := 1; i < attempt && d < maxD; i++ {
		d *= 2
	}
	return min(d, maxD)
}

// partitions returns how many partitions the topic has, from the
// Transport's metadata (which caches it).
func (s *KafkaSink) partitions(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, s.readTimeout)
	defer cancel()
	var rt kafkago.RoundTripper = kafkago.DefaultTransport
	if s.client.Transport != nil {
		rt = s.client.Transport
	}
	r, err := rt.RoundTrip(ctx, s.client.Addr, &metadataAPI.Request{TopicNames: []string{s.topic}, AllowAutoTopicCreation: s.autoCreate})
	if err != nil {
		return 0, fmt.Errorf("outbox: metadata of %s: %w", s.topic, err)
	}
	for _, t := range r.(*metadataAPI.Response).Topics {
		if t.Name == s.topic {
			if t.ErrorCode != 0 {
				return 0, fmt.Errorf("outbox: metadata of %s: %w", s.topic, kafkago.Error(t.ErrorCode))
			}
			if len(t.Partitions) == 0 {
				return 0, fmt.Errorf("outbox: metadata of %s: %w", s.topic, kafkago.LeaderNotAvailable)
			}
			return len(t.Partitions), nil
		}
	}
	return 0, fmt.Errorf("outbox: metadata of %s: %w", s.topic, kafkago.UnknownTopicOrPartition)
}

// outRecords reads the messages at idx as the records of one request.
type outRecords struct {
	out        []outMsg
	idx        []int
	n          int
	rec        kafkago.Record
	key, value bytesReader
}

// bytesReader is a record's key or value.
type bytesReader struct{ bytes.Reader }

func (*bytesReader) Close() error { return nil }

func (r *outRecords) ReadRecord() (*kafkago.Record, error) {
	if r.n >= len(r.idx) {
		return nil, io.EOF
	}
	m := &r.out[r.idx[r.n]].km
	r.n++
	r.rec = kafkago.Record{Headers: m.Headers}
	if m.Key != nil {
		r.key.Reset(m.Key)
		r.rec.Key = &r.key
	}
	if m.Value != nil {
		r.value.Reset(m.Value)
		r.rec.Value = &r.value
	}
	return &r.rec, nil
}

// classifyKafka marks the broker's refusals that a retry cannot change.
// An unknown topic counts as one: a sink names a topic that should exist,
// and a message parked while it did not is redriven once it does.
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
			kafkago.TopicAuthorizationFailed, kafkago.InvalidRecord,
			kafkago.UnknownTopicOrPartition:
			return Permanent(err)
		}
	}
	return err
}
