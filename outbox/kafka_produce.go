package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// How KafkaSink cuts a Publish into produce requests and sends them: per
// partition, in order, one request at a time, a key stopped at its first
// failure.

// Publish writes msgs and reports, per message, what failed.
func (s *KafkaSink) Publish(ctx context.Context, msgs []Message) error {
	if len(msgs) == 0 {
		return nil
	}
	gen := s.metaGen.Load()
	n, err := s.partitions(ctx)
	if err != nil && unknownTopic(err) {
		// The Transport's cached metadata may predate the topic: ask the
		// broker, and ask again once the cache is reset.
		if err = s.recheckTopic(ctx, gen, err); err == nil {
			n, err = s.partitions(ctx)
		}
	}
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
		gen := s.metaGen.Load()
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
		if unknownTopic(err) {
			// Unknown to the Transport's cache or to the broker that
			// answered: only fresh metadata that does not list the topic
			// makes it permanent. Otherwise the request, not appended, is
			// tried again in place.
			if cerr := s.recheckTopic(ctx, gen, err); IsPermanent(cerr) {
				return cerr
			}
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
