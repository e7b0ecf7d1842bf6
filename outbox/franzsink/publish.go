package franzsink

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/effectively-once/effectively/outbox"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// errBehind is the error of a message not sent because an earlier message
// of its key failed in the same Publish.
var errBehind = errors.New("franzsink: not sent: an earlier message of its key failed")

// Publish writes msgs and reports, per message, what failed.
//
// The messages go out in chunks the client buffers whole (at most
// kgo.MaxBufferedRecords records and kgo.MaxBufferedBytes bytes), one
// chunk flushed and settled before the next is buffered; a key with a
// failed message sends none of its later ones.
func (s *Sink) Publish(ctx context.Context, msgs []outbox.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Records of a Publish given up on may still be buffered: they settle
	// first, ahead of these.
	if s.cl.BufferedProduceRecords() > 0 {
		if err := s.cl.Flush(ctx); err != nil {
			return err
		}
	}
	errs := make([]error, len(msgs))
	failed := map[string]bool{} // keys with a failed message in this call
	fail := func(i int, err error) {
		errs[i] = err
		if k := msgs[i].Key; k != nil {
			failed[string(k)] = true
		}
	}
	for next := 0; next < len(msgs); {
		var chunk []int
		var bytes int64
		for ; next < len(msgs) && len(chunk) < s.maxRecs; next++ {
			m := &msgs[next]
			if m.Key != nil && failed[string(m.Key)] {
				errs[next] = errBehind
				continue
			}
			if err := s.tooLarge(m); err != nil {
				fail(next, err)
				continue
			}
			size := userSize(m)
			if s.maxBytes > 0 && len(chunk) > 0 && bytes+size > s.maxBytes {
				break
			}
			bytes += size
			chunk = append(chunk, next)
		}
		if len(chunk) == 0 {
			continue
		}
		res, err := s.produce(ctx, msgs, chunk)
		if err != nil { // ctx ended: this chunk's outcomes are unknown, the rest is not sent
			for _, i := range chunk {
				errs[i] = err
			}
			for i := next; i < len(msgs); i++ {
				errs[i] = err
			}
			break
		}
		for n, i := range chunk {
			if res[n] != nil {
				fail(i, res[n])
			}
		}
	}
	pe := outbox.PublishErrors{}
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

// produce buffers the messages at idx, flushes them and returns each one's
// outcome, or ctx's error if it ended before all were settled.
func (s *Sink) produce(ctx context.Context, msgs []outbox.Message, idx []int) ([]error, error) {
	res := make([]error, len(idx))
	var wg sync.WaitGroup
	wg.Add(len(idx))
	for n, i := range idx {
		// Not ctx: the client would fail a record whose context ended
		// only where that is safe, and the sink must not report a record
		// failed that it then writes ahead of a later one of its key; a
		// Publish given up on settles at the next Publish or Close.
		s.cl.Produce(context.Background(), record(s.topic, &msgs[i]), func(_ *kgo.Record, err error) {
			res[n] = classify(err)
			wg.Done()
		})
	}
	if err := s.cl.Flush(ctx); err != nil {
		return nil, err
	}
	wg.Wait()
	return res, nil
}

func record(topic string, m *outbox.Message) *kgo.Record {
	hs := make([]kgo.RecordHeader, 0, len(m.Headers)+1)
	for _, h := range m.Headers {
		hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	hs = append(hs, kgo.RecordHeader{Key: outbox.IDHeader, Value: []byte(m.ID)})
	return &kgo.Record{Topic: topic, Key: m.Key, Value: m.Value, Headers: hs}
}

// userSize is what kgo counts against kgo.MaxBufferedBytes.
func userSize(m *outbox.Message) int64 {
	n := len(m.Key) + len(m.Value) + len(outbox.IDHeader) + len(m.ID)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// recordBound is at least what m weighs alone in a record batch: the
// batch's framing (61 bytes), the record's varint fields at their widest,
// and a margin for the flexible request versions.
func recordBound(m *outbox.Message) int64 {
	const batch, record, field, margin = 61, 1 + 10 + 5 + 5, 5, 16
	n := batch + record + margin + 3*field + len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += 2*field + len(h.Key) + len(h.Value)
	}
	n += 2*field + len(outbox.IDHeader) + len(m.ID)
	return int64(n)
}

// tooLarge refuses, without sending it, a message the client would refuse
// on its own (kgo fails such a record alone, not the records behind it,
// which would let the key's next message overtake it).
func (s *Sink) tooLarge(m *outbox.Message) error {
	if b := recordBound(m); b > s.batchMax {
		return outbox.Permanent(fmt.Errorf("franzsink: the message is about %d bytes, over the client's ProducerBatchMaxBytes (%d): %w", b, s.batchMax, kerr.MessageTooLarge))
	}
	if u := userSize(m); s.maxBytes > 0 && u > s.maxBytes {
		return outbox.Permanent(fmt.Errorf("franzsink: the message is %d bytes, over the client's MaxBufferedBytes (%d): %w", u, s.maxBytes, kerr.MessageTooLarge))
	}
	return nil
}
