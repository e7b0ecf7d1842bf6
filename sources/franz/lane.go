package franz

import (
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/sources/kafka"
)

type laneState uint8

const (
	// laneActive: owned; Fetch may hand out its messages.
	laneActive laneState = iota
	// laneRevoking: the partition is being revoked; its in-flight batch
	// may still commit, nothing more is handed out.
	laneRevoking
	// laneRevoked: no longer owned; its in-flight batch, if any, is
	// refused and nothing is acknowledged for it.
	laneRevoked
)

// lane is one claimed partition: its commit point. Which of its messages
// are handed out when is Source.sched's, where the lane is known by its
// name. All fields but the immutable ones are guarded by Source.mu.
type lane struct {
	name      string
	tp        TopicPartition
	topic     string
	partition int
	gen       int32 // the generation that claimed the partition

	state  laneState
	fenced bool // Postgres refused its offset write
	paused bool // its fetches are paused: the buffer is full

	// next is the offset after the last record buffered (-1 before the
	// first): records below it that franz-go returns again (after a
	// SetOffsets) are not buffered twice. delivered is the offset after
	// the last record handed out; committed the commit point after the
	// last settled batch; persisted what the offsets table is known to
	// hold, writing what the in-flight batch's BeforeCommit stored, and
	// kafkaCommitted what Kafka holds; -1 when unknown. persistedHigh and
	// writingHigh are the same for the table's high offset (see
	// kafka.StoredPosition).
	next, delivered, committed, persisted, writing, kafkaCommitted int64
	persistedHigh, writingHigh                                     int64
	// origin is the offset from which the group first consumed the
	// partition with its offsets in Postgres, committed to Kafka with the
	// offsets (see kafka.OriginMetadata); -1 until known.
	origin int64
	// highWatermark is the end of the partition's log as of its last
	// fetch, -1 before.
	highWatermark int64
}

func newLane(tp TopicPartition, gen int32) *lane {
	return &lane{
		name: laneName(tp.Topic, tp.Partition), tp: tp, topic: tp.Topic, partition: tp.Partition, gen: gen,
		next: -1, delivered: -1, committed: -1, persisted: -1, writing: -1, kafkaCommitted: -1, origin: -1, highWatermark: -1,
		persistedHigh: -1, writingHigh: -1,
	}
}

// startAt positions a lane whose start offset is known.
func (l *lane) startAt(start int64) {
	l.next, l.delivered, l.committed = start, start, start
}

// handedOut records that b was handed out.
func (l *lane) handedOut(b *consumer.Batch) {
	l.writing, l.writingHigh = -1, -1
	for _, m := range b.Messages {
		l.delivered = max(l.delivered, offsetOf(m)+1)
	}
}

// nextOffset is the partition's commit point once the messages of batch
// that are in acked have committed: the lowest offset still outstanding
// (waiting for a retry, or in batch but not acked), else the offset after
// the last record handed out.
func (l *lane) nextOffset(retries, batch []*consumer.Message, acked map[*consumer.Message]struct{}) int64 {
	next := l.delivered
	low := func(off int64) {
		if next < 0 || off < next {
			next = off
		}
	}
	for _, r := range retries {
		low(offsetOf(r))
	}
	for _, m := range batch {
		if _, ok := acked[m]; !ok {
			low(offsetOf(m))
		}
	}
	return next
}

// known is the position the offsets table is known to hold.
func (l *lane) known() kafka.StoredPosition {
	return kafka.StoredPosition{Next: l.persisted, High: l.persistedHigh}
}

// highOffset is the offset after the highest of acked, or next when that
// is higher: the high offset stored with a batch that commits acked.
func highOffset(next int64, acked []*consumer.Message) int64 {
	high := next
	for _, m := range acked {
		high = max(high, offsetOf(m)+1)
	}
	return high
}

// settled moves the commit point up after l's in-flight batch was
// settled, retries being what waits for redelivery now. With store
// (offsets in Postgres) a batch with acked messages committed the offset
// its BeforeCommit wrote.
func (l *lane) settled(retries []*consumer.Message, acked bool, store bool) {
	if store && acked {
		l.persisted = max(l.persisted, l.writing)
		l.persistedHigh = max(l.persistedHigh, l.writingHigh)
	}
	if next := l.nextOffset(retries, nil, nil); next > l.committed {
		l.committed = next
	}
}

// deliveryCounts is what a Source delivered of one partition while it
// owned it before and has not seen committed, so that Message.Attempt goes
// on counting when the partition is assigned to it again after a
// rebalance. Guarded by Source.mu.
type deliveryCounts struct {
	upTo  int64         // every offset below was delivered at least once
	times map[int64]int // deliveries of the offsets delivered more than once
}

// firstAttempt is the Attempt of the first delivery, in l's ownership, of
// the record at off: 1 unless this source delivered it before.
func (s *Source) firstAttempt(l *lane, off int64) int {
	c := s.counts[l.tp]
	if c == nil || off >= c.upTo {
		return 1
	}
	return max(c.times[off], 1) + 1
}

// rememberCounts records, as l is revoked, how often its records not yet
// committed were delivered: those of its batch in flight and those
// waiting for a retry.
func (s *Source) rememberCounts(l *lane, inFlight *consumer.Batch, retries []*consumer.Message) {
	c := s.counts[l.tp]
	if c == nil {
		c = &deliveryCounts{upTo: -1, times: map[int64]int{}}
		s.counts[l.tp] = c
	}
	c.upTo = max(c.upTo, l.delivered)
	note := func(m *consumer.Message) {
		d, ok := m.SourceData.(*delivery)
		if ok && m.Attempt > 1 && m.Attempt > c.times[d.offset] {
			c.times[d.offset] = m.Attempt
		}
	}
	for _, r := range retries {
		note(r)
	}
	if inFlight != nil {
		for _, m := range inFlight.Messages {
			note(m)
		}
	}
	s.forgetCounts(l.tp, l.committed)
}

// forgetCounts drops the counts of tp's offsets below next, which
// committed (or which a new claim skips).
func (s *Source) forgetCounts(tp TopicPartition, next int64) {
	c := s.counts[tp]
	if c == nil || next < 0 {
		return
	}
	if next >= c.upTo {
		delete(s.counts, tp)
		return
	}
	for off := range c.times {
		if off < next {
			delete(c.times, off)
		}
	}
}
