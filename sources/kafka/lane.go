package kafka

import (
	"slices"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/lanes"
)

type laneState uint8

const (
	// laneActive: owned; Fetch may hand out its messages.
	laneActive laneState = iota
	// laneRevoking: the generation ended; its in-flight batch may still
	// commit, nothing more is handed out.
	laneRevoking
	// laneRevoked: no longer owned; its in-flight batch, if any, is refused
	// and nothing is acknowledged for it.
	laneRevoked
)

// lane is one assigned partition in one generation: its commit point.
// Which of its messages are handed out when (order, retries, the buffer
// between the pump and Fetch) is Source.sched's, where the lane is known
// by its name. All fields but the immutable ones are guarded by Source.mu.
type lane struct {
	name      string
	topic     string
	partition int
	gen       *generation
	fetcher   *fetcher // set before the lane is published; for Lag

	state  laneState
	fenced bool // Postgres said a newer generation owns it

	// fetched is the offset after everything the pump has fetched, records
	// it dropped (control records, records of aborted transactions)
	// included: every record below it is buffered or was handed out.
	// delivered is the offset after the last record handed out, and
	// fetched once nothing is buffered, so that it moves past dropped
	// records. committed is the commit point after the last settled batch
	// (or after dropped records, once nothing before them is outstanding),
	// persisted what the offsets table is known to hold, writing what the
	// in-flight batch's BeforeCommit stored, and kafkaCommitted what Kafka
	// holds; -1 when unknown. persistedHigh and writingHigh are the same
	// for the table's high offset (see position).
	fetched, delivered, committed, persisted, writing, kafkaCommitted int64
	persistedHigh, writingHigh                                        int64
	// origin is the offset from which the group first consumed the
	// partition with its offsets in Postgres, committed to Kafka with the
	// offsets (see origin.go); -1 until known (the fetcher resolves a
	// start such as kafkago.FirstOffset).
	origin int64

	// rel is the release of the lane's batch that BeforeCommit let go of
	// the lane while it commits (see pipeline.go), until it is settled;
	// lastRel the one before, kept for a batch handed out before it was
	// settled and fetched after.
	rel, lastRel *release
	// waitFor is what the lane's batch in flight, waiter, handed out while
	// the batch before it committed, waits for before its handlers run.
	waiter  *consumer.Batch
	waitFor *release
}

func offsetOf(m *consumer.Message) int64 { return m.SourceData.(*delivery).offset }

// handedOut records that b was handed out, st being its lane's state in
// the scheduler after that.
func (l *lane) handedOut(b *consumer.Batch, st lanes.State) {
	if st.Committing == nil { // else what the committing batch wrote is still to settle
		l.writing, l.writingHigh = -1, -1
	}
	buffered := st.Buffered
	for _, m := range b.Messages {
		l.delivered = max(l.delivered, offsetOf(m)+1)
	}
	if buffered == 0 && l.fetched > l.delivered {
		l.delivered = l.fetched // past the records dropped after the last one
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

// outstanding is what of l is handed out or handed back and not settled,
// b aside: the messages waiting for a retry, and those of the lane's other
// batch in flight (one committing, or the one after it).
func outstanding(st lanes.State, b *consumer.Batch) []*consumer.Message {
	out := st.Retries
	for _, o := range []*consumer.Batch{st.Committing, st.InFlight} {
		if o != nil && o != b {
			out = append(slices.Clip(out), o.Messages...)
		}
	}
	return out
}

// known is the position the offsets table is known to hold.
func (l *lane) known() position { return position{next: l.persisted, high: l.persistedHigh} }

// highOffset is the offset after the highest of acked, or next when that
// is higher: the high offset stored with a batch that commits acked.
func highOffset(next int64, acked []*consumer.Message) int64 {
	high := next
	for _, m := range acked {
		high = max(high, offsetOf(m)+1)
	}
	return high
}

// skipTo records that the pump fetched everything below next. When l is
// idle (nothing in flight, nothing to retry, nothing buffered: st) everything
// below its delivered offset is settled, including the records the fetcher
// dropped at the end of what it fetched (control records, records of
// aborted transactions): the commit point moves there, and skipTo returns
// it as the offset to store when the offsets table (store) does not hold
// it yet, so that a restart does not fetch those records again.
func (l *lane) skipTo(next int64, st lanes.State, store bool) (target int64, write bool) {
	l.fetched = max(l.fetched, next)
	if st.Buffered == 0 {
		l.delivered = max(l.delivered, l.fetched)
	}
	if l.state != laneActive || l.fenced || st.InFlight != nil || st.Committing != nil || st.Buffered > 0 || len(st.Retries) > 0 || l.delivered < 0 {
		return 0, false
	}
	if l.delivered > l.committed {
		l.committed = l.delivered
		l.notifyCommit()
	}
	return l.delivered, store && l.delivered > l.persisted
}

// stored records that the offsets table holds next.
func (l *lane) stored(next int64) {
	l.persisted = max(l.persisted, next)
	l.persistedHigh = max(l.persistedHigh, next)
	l.committed = max(l.committed, next)
	l.notifyCommit()
}

// notifyCommit asks the generation for a Kafka offset commit.
func (l *lane) notifyCommit() {
	select {
	case l.gen.commit <- struct{}{}:
	default:
	}
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

// deliveryCounts is what a Source delivered of one partition in earlier
// generations and has not seen committed, so that Message.Attempt goes on
// counting when the partition is assigned to it again after a rebalance.
// Guarded by Source.mu.
type deliveryCounts struct {
	upTo  int64         // every offset below was delivered at least once
	times map[int64]int // deliveries of the offsets delivered more than once
}

// firstAttempt is the Attempt of the first delivery, in l's generation, of
// the record at off: 1 unless an earlier generation of this source
// delivered it already.
func (s *Source) firstAttempt(l *lane, off int64) int {
	c := s.counts[topicPartition{l.topic, l.partition}]
	if c == nil || off >= c.upTo {
		return 1
	}
	return max(c.times[off], 1) + 1
}

// rememberCounts records, as l's generation ends, how often l's records
// not yet committed were delivered: those of its batches in flight (one
// committing and the one after it) and those waiting for a retry.
func (s *Source) rememberCounts(l *lane, inFlight []*consumer.Batch, retries []*consumer.Message) {
	tp := topicPartition{l.topic, l.partition}
	c := s.counts[tp]
	if c == nil {
		c = &deliveryCounts{upTo: -1, times: map[int64]int{}}
		s.counts[tp] = c
	}
	c.upTo = max(c.upTo, l.delivered)
	note := func(m *consumer.Message) { // the latest delivery of its record
		d, ok := m.SourceData.(*delivery)
		if ok && m.Attempt > 1 && m.Attempt > c.times[d.offset] {
			c.times[d.offset] = m.Attempt
		}
	}
	for _, r := range retries {
		note(r)
	}
	for _, b := range inFlight {
		if b != nil {
			for _, m := range b.Messages {
				note(m)
			}
		}
	}
	s.forgetCounts(tp, l.committed)
}

// forgetCounts drops the counts of tp's offsets below next, which
// committed (or which a new generation skips).
func (s *Source) forgetCounts(tp topicPartition, next int64) {
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
