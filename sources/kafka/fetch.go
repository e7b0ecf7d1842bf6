package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/effectively-once/effectively/consumer"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"
	metaapi "github.com/segmentio/kafka-go/protocol/metadata"

	// The codecs of compressed record batches; kafka-go's protocol package
	// registers them through its compress package, imported here to say so.
	_ "github.com/segmentio/kafka-go/compress"
)

// Kafka's isolation levels, as the Fetch request carries them.
const (
	isolationReadUncommitted int8 = 0
	isolationReadCommitted   int8 = 1
)

// Control record types (the key of a control record is a version and a
// type, two int16s).
const controlAbort int16 = 0

// fetchSlack is how long a Fetch request may take beyond MaxWait before it
// is given up and sent again.
const fetchSlack = 30 * time.Second

// fetcher reads one partition with the Fetch requests of the Kafka
// protocol, from an offset on, and decodes the record batches itself:
// control batches (the commit and abort markers of transactions) are never
// handed on, and under read-committed neither are the records of aborted
// transactions. It keeps its own connections (a kafka-go Transport), as the
// broker serves one request of a connection at a time and every partition
// waits up to MaxWait in its own fetch. A fetcher is used by one goroutine.
type fetcher struct {
	topic     string
	partition int
	lane      string
	addr      net.Addr
	transport *kafkago.Transport
	isolation int8
	minBytes  int32
	maxBytes  int32
	maxWait   time.Duration
	log       *slog.Logger

	// offset is the next offset to fetch; kafkago.FirstOffset or
	// kafkago.LastOffset until the first fetch resolved it.
	offset int64
	// highWatermark is the end of the partition's log as of the last
	// fetch, -1 before the first; read by Lag from other goroutines.
	highWatermark atomic.Int64
	// throttled is when the broker, enforcing a quota, lets the next
	// fetch be sent.
	throttled time.Time
}

// fetchedRecord is one record a fetch delivers. Key, Value and header
// values are nil for a null and non-nil for an empty one.
type fetchedRecord struct {
	offset  int64
	time    time.Time
	key     []byte
	value   []byte
	headers []consumer.Header
}

// fetchResult is what one fetch yields: the records to deliver, in offset
// order, and next, the offset to fetch next. next is past every record the
// fetch covered, also those it dropped (control records, records of
// aborted transactions), so no offset below it is ever delivered later.
type fetchResult struct {
	records []fetchedRecord
	from    int64 // the offset fetched from
	next    int64
}

func (s *Source) newFetcher(tp topicPartition, start int64) *fetcher {
	return newFetcher(s.cfg, s.log, tp, start)
}

// newFetcher returns a fetcher of tp from start with c's connection and
// fetch settings; c has its defaults applied.
func newFetcher(c Config, log *slog.Logger, tp topicPartition, start int64) *fetcher {
	f := &fetcher{
		topic: tp.topic, partition: tp.partition, lane: laneName(tp.topic, tp.partition),
		addr: kafkago.TCP(c.Brokers...),
		transport: &kafkago.Transport{
			TLS: c.TLS, SASL: c.SASL, ClientID: c.ClientID, DialTimeout: c.DialTimeout,
			MetadataTopics: []string{tp.topic},
		},
		isolation: isolationReadCommitted,
		minBytes:  int32(min(c.MinBytes, 1<<31-1)),
		maxBytes:  int32(min(c.MaxBytes, 1<<31-1)),
		maxWait:   c.MaxWait,
		log:       log,
		offset:    start,
	}
	if c.ReadUncommitted {
		f.isolation = isolationReadUncommitted
	}
	f.highWatermark.Store(-1)
	return f
}

// close drops the fetcher's connections.
func (f *fetcher) close() { f.transport.CloseIdleConnections() }

// refresh drops the fetcher's connections and cached cluster metadata, so
// that the next request finds the partition's leader again.
func (f *fetcher) refresh() { f.transport.CloseIdleConnections() }

// fetch sends one Fetch request from f.offset and decodes its response. On
// success f.offset moves to the result's next offset. An error leaves the
// offset where it was; the caller backs off and calls fetch again.
func (f *fetcher) fetch(ctx context.Context) (fetchResult, error) {
	if wait := time.Until(f.throttled); wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fetchResult{next: f.offset}, ctx.Err()
		case <-t.C:
		}
	}
	if f.offset < 0 {
		if err := f.resolve(ctx); err != nil {
			return fetchResult{next: f.offset}, err
		}
	}
	rctx, cancel := context.WithTimeout(ctx, f.maxWait+fetchSlack)
	defer cancel()
	m, err := f.transport.RoundTrip(rctx, f.addr, &fetchapi.Request{
		ReplicaID:      -1,
		MaxWaitTime:    int32(min(f.maxWait.Milliseconds(), 1<<31-1)),
		MinBytes:       f.minBytes,
		MaxBytes:       f.maxBytes,
		IsolationLevel: f.isolation,
		SessionID:      0,
		SessionEpoch:   -1, // a full fetch, no fetch session
		Topics: []fetchapi.RequestTopic{{
			Topic: f.topic,
			Partitions: []fetchapi.RequestPartition{{
				Partition:          int32(f.partition),
				CurrentLeaderEpoch: -1,
				FetchOffset:        f.offset,
				LogStartOffset:     -1,
				PartitionMaxBytes:  f.maxBytes,
			}},
		}},
	})
	if err != nil {
		if ctx.Err() != nil {
			return fetchResult{next: f.offset}, ctx.Err()
		}
		return fetchResult{next: f.offset}, f.routeError(ctx, err)
	}
	res, ok := m.(*fetchapi.Response)
	if !ok {
		return fetchResult{next: f.offset}, fmt.Errorf("fetch: unexpected response %T", m)
	}
	if res.ThrottleTimeMs > 0 {
		f.throttled = time.Now().Add(time.Duration(res.ThrottleTimeMs) * time.Millisecond)
	}
	if res.ErrorCode != 0 {
		f.refresh()
		return fetchResult{next: f.offset}, fmt.Errorf("fetch: %w", kafkago.Error(res.ErrorCode))
	}
	p := f.findPartition(res)
	if p == nil {
		f.refresh()
		return fetchResult{next: f.offset}, fmt.Errorf("fetch: the response has no partition %s", f.lane)
	}
	if p.ErrorCode != 0 {
		perr := kafkago.Error(p.ErrorCode)
		if errors.Is(perr, kafkago.OffsetOutOfRange) {
			return f.outOfRange(ctx)
		}
		f.refresh() // not the leader, leader moved, unknown partition: find it again
		return fetchResult{next: f.offset}, fmt.Errorf("fetch at offset %d: %w", f.offset, perr)
	}
	f.highWatermark.Store(p.HighWatermark)
	out, err := f.decode(p)
	if err != nil {
		return fetchResult{next: f.offset}, err
	}
	out.from, f.offset = f.offset, out.next
	return out, nil
}

func (f *fetcher) findPartition(res *fetchapi.Response) *fetchapi.ResponsePartition {
	for i := range res.Topics {
		t := &res.Topics[i]
		if t.Topic != f.topic {
			continue
		}
		for j := range t.Partitions {
			if int(t.Partitions[j].Partition) == f.partition {
				return &t.Partitions[j]
			}
		}
	}
	return nil
}

// routeError explains a failed round trip. The transport routes a fetch to
// the partition's leader by its cached metadata, so a failure to route
// ("topic not found", "no leader") may hide why the metadata is missing (the
// brokers cannot be reached, authentication failed): ask for it. Either way
// the cached metadata is dropped, so that the next attempt looks the leader
// up again.
func (f *fetcher) routeError(ctx context.Context, err error) error {
	defer f.refresh()
	var ferr *fetchapi.Error
	if !errors.As(err, &ferr) {
		return fmt.Errorf("fetch at offset %d: %w", f.offset, err)
	}
	m, merr := f.transport.RoundTrip(ctx, f.addr, &metaapi.Request{TopicNames: []string{f.topic}})
	if merr != nil {
		return fmt.Errorf("fetch at offset %d: metadata: %w", f.offset, merr)
	}
	if md, ok := m.(*metaapi.Response); ok {
		for _, t := range md.Topics {
			if t.Name == f.topic && t.ErrorCode != 0 {
				return fmt.Errorf("fetch at offset %d: topic %s: %w", f.offset, f.topic, kafkago.Error(t.ErrorCode))
			}
		}
	}
	return fmt.Errorf("fetch at offset %d: %w", f.offset, err)
}

// offsets returns the first offset of the partition's log and its end (the
// last stable offset under read-committed).
func (f *fetcher) offsets(ctx context.Context) (first, last int64, err error) {
	cl := &kafkago.Client{Addr: f.addr, Transport: f.transport, Timeout: f.maxWait + fetchSlack}
	res, err := cl.ListOffsets(ctx, &kafkago.ListOffsetsRequest{
		Topics:         map[string][]kafkago.OffsetRequest{f.topic: {kafkago.FirstOffsetOf(f.partition), kafkago.LastOffsetOf(f.partition)}},
		IsolationLevel: kafkago.IsolationLevel(f.isolation),
	})
	if err != nil {
		f.refresh()
		return 0, 0, fmt.Errorf("list offsets: %w", err)
	}
	for _, p := range res.Topics[f.topic] {
		if p.Partition != f.partition {
			continue
		}
		if p.Error != nil {
			f.refresh()
			return 0, 0, fmt.Errorf("list offsets: %w", p.Error)
		}
		return p.FirstOffset, p.LastOffset, nil
	}
	f.refresh()
	return 0, 0, fmt.Errorf("list offsets: the response has no partition %s", f.lane)
}

// resolve turns kafkago.FirstOffset or kafkago.LastOffset into an offset.
func (f *fetcher) resolve(ctx context.Context) error {
	first, last, err := f.offsets(ctx)
	if err != nil {
		return err
	}
	if f.offset == kafkago.LastOffset {
		f.offset = last
	} else {
		f.offset = first
	}
	f.log.Debug("kafka: starting partition", "lane", f.lane, "offset", f.offset)
	return nil
}

// outOfRange handles an offset the broker does not have, as kafka-go's
// Reader does: below the start of the log (retention deleted the records)
// it moves to the first offset and warns; inside the log again (it grew
// meanwhile) it fetches again at once; past its end it reports an error, so
// that the caller backs off and tries again.
func (f *fetcher) outOfRange(ctx context.Context) (fetchResult, error) {
	first, last, err := f.offsets(ctx)
	if err != nil {
		return fetchResult{next: f.offset}, fmt.Errorf("fetch at offset %d: out of range, and then %w", f.offset, err)
	}
	switch {
	case f.offset < first:
		f.log.Warn("kafka: offset below the start of the log (records deleted by retention); skipping to the first offset",
			"lane", f.lane, "offset", f.offset, "first", first, "skipped", first-f.offset)
		f.offset = first
		return fetchResult{next: f.offset}, nil
	case f.offset < last:
		return fetchResult{next: f.offset}, nil
	}
	return fetchResult{next: f.offset}, fmt.Errorf("fetch at offset %d: past the end of the log (%d); "+
		"if the topic was recreated, delete the group's rows from the offsets table: %w", f.offset, last, kafkago.OffsetOutOfRange)
}

// decode turns the record batches of a response partition into records to
// deliver, dropping control batches and, under read-committed, the batches
// of aborted transactions the way Kafka's Java consumer does: the response
// lists the aborted transactions overlapping it (producer ID and first
// offset); a producer's batches count as aborted from its transaction's
// first offset until its abort marker.
func (f *fetcher) decode(p *fetchapi.ResponsePartition) (fetchResult, error) {
	from := f.offset
	out := fetchResult{next: from}
	advance := func(off int64) {
		if off > out.next {
			out.next = off
		}
	}

	var batches []protocol.RecordReader
	switch r := p.RecordSet.Records.(type) {
	case nil:
	case *protocol.RecordStream:
		batches = r.Records
	default:
		batches = []protocol.RecordReader{r}
	}

	readCommitted := f.isolation == isolationReadCommitted
	var pending []fetchapi.ResponseTransaction // aborted transactions not yet reached
	if readCommitted && len(p.AbortedTransactions) > 0 {
		pending = slices.Clone(p.AbortedTransactions)
		slices.SortFunc(pending, func(a, b fetchapi.ResponseTransaction) int {
			return cmp.Compare(a.FirstOffset, b.FirstOffset)
		})
	}
	aborted := map[int64]struct{}{} // producers inside an aborted transaction
	reach := func(upTo int64) {
		for len(pending) > 0 && pending[0].FirstOffset <= upTo {
			aborted[pending[0].ProducerID] = struct{}{}
			pending = pending[1:]
		}
	}

	for _, b := range batches {
		switch b := b.(type) {
		case *protocol.ControlBatch:
			// A control batch holds one control record. Batches come in
			// offset order, so everything before this one was covered.
			advance(b.BaseOffset)
			if readCommitted {
				reach(b.BaseOffset)
			}
			for {
				r, err := b.ReadRecord()
				if err != nil {
					break
				}
				advance(r.Offset + 1)
				cr, err := protocol.ReadControlRecord(r)
				if err == nil && cr.Type == controlAbort {
					delete(aborted, b.ProducerID)
				}
			}
		case *protocol.RecordBatch:
			advance(b.BaseOffset)
			drop := false
			if readCommitted && b.ProducerID >= 0 {
				reach(b.BaseOffset)
				_, drop = aborted[b.ProducerID]
				drop = drop && b.Attributes.Transactional()
			}
			if err := f.records(b, from, drop, &out, advance); err != nil {
				return out, err
			}
		default: // a message set of the older formats, which know no transactions
			if err := f.records(b, from, false, &out, advance); err != nil {
				return out, err
			}
		}
	}

	if out.next == from && len(batches) > 0 {
		// The response held batches but no record at or after the offset:
		// the log cleaner emptied the end of a batch (its last records
		// were compacted away). No record lives at this offset; kafka-go
		// does not decode where the batch ends, so step over it one
		// offset at a time.
		f.log.Debug("kafka: no record at the offset in the fetched batches; moving on", "lane", f.lane, "offset", from)
		out.next = from + 1
	}
	if out.next == from && len(batches) == 0 {
		end := p.HighWatermark
		if readCommitted {
			end = p.LastStableOffset
		}
		if end > from {
			return out, fmt.Errorf("fetch at offset %d: no complete record batch in the response although the log reaches %d; "+
				"a batch may be larger than MaxBytes (%d)", from, end, f.maxBytes)
		}
	}
	return out, nil
}

// records reads the records of one batch; those at or after from are
// delivered unless drop is set.
func (f *fetcher) records(b protocol.RecordReader, from int64, drop bool, out *fetchResult, advance func(int64)) error {
	for {
		r, err := b.ReadRecord()
		if err != nil {
			return nil // io.EOF, or the batch was cut short: the next fetch starts after what was read
		}
		rec := fetchedRecord{offset: r.Offset, time: r.Time}
		rec.key, err = readBytes(r.Key)
		if err == nil {
			rec.value, err = readBytes(r.Value)
		}
		if err != nil {
			return fmt.Errorf("fetch: record at offset %d: %w", r.Offset, err)
		}
		if drop || r.Offset < from {
			advance(r.Offset + 1)
			continue
		}
		if len(r.Headers) > 0 {
			rec.headers = make([]consumer.Header, len(r.Headers))
			for i, h := range r.Headers {
				rec.headers[i] = consumer.Header{Key: h.Key, Value: h.Value}
			}
		}
		out.records = append(out.records, rec)
		advance(r.Offset + 1)
	}
}

// readBytes copies a key or value out of the response and releases it: nil
// for a null, a non-nil slice for an empty one.
func readBytes(b protocol.Bytes) ([]byte, error) {
	if b == nil {
		return nil, nil
	}
	defer b.Close()
	return protocol.ReadAll(b)
}
