package kafka

import (
	"sort"
	"time"

	"github.com/effectively-once/effectively/consumer"
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

// lane is one assigned partition in one generation. All fields but the
// immutable ones are guarded by Source.mu.
type lane struct {
	name      string
	topic     string
	partition int
	gen       *generation
	fetcher   *fetcher // set before the lane is published; for Lag

	state    laneState
	fenced   bool            // Postgres said a newer generation owns it
	inFlight *consumer.Batch // the batch being processed, if any

	buf     []*delivery // fetched, not yet handed out, in offset order
	full    bool        // the pump waits for room in buf
	space   chan struct{}
	retries []retrySlot // handed back, sorted by offset

	// fetched is the offset after everything the pump has fetched, records
	// it dropped (control records, records of aborted transactions)
	// included: every record below it is in buf or was handed out.
	// delivered is the offset after the last record handed out from buf,
	// and fetched once buf is empty, so that it moves past dropped records.
	// committed is the commit point after the last settled batch (or after
	// dropped records, once nothing before them is outstanding), persisted
	// what the offsets table is known to hold, writing what the in-flight
	// batch's BeforeCommit stored, and kafkaCommitted what Kafka holds; -1
	// when unknown.
	fetched, delivered, committed, persisted, writing, kafkaCommitted int64
}

type retrySlot struct {
	d   *delivery
	due time.Time
}

func (l *lane) fetchable() bool { return l.state == laneActive && !l.fenced && l.inFlight == nil }

// ready reports whether l has something to hand out now, and otherwise the
// earliest time a retry falls due (zero when none).
func (l *lane) ready(now time.Time) (bool, time.Time) {
	if len(l.buf) > 0 {
		return true, time.Time{}
	}
	var next time.Time
	for _, r := range l.retries {
		if !r.due.After(now) {
			return true, time.Time{}
		}
		if next.IsZero() || r.due.Before(next) {
			next = r.due
		}
	}
	return false, next
}

// take hands out up to max messages: due retries first, in offset order,
// then fresh ones.
func (l *lane) take(max int, now time.Time) []*consumer.Message {
	var msgs []*consumer.Message
	if len(l.retries) > 0 {
		kept := l.retries[:0]
		for _, r := range l.retries {
			if len(msgs) < max && !r.due.After(now) {
				r.d.msg.Attempt++
				msgs = append(msgs, &r.d.msg)
			} else {
				kept = append(kept, r)
			}
		}
		clear(l.retries[len(kept):])
		l.retries = kept
	}
	l.writing = -1
	n := min(max-len(msgs), len(l.buf))
	if n > 0 {
		if msgs == nil {
			msgs = make([]*consumer.Message, 0, n)
		}
		for _, d := range l.buf[:n] {
			msgs = append(msgs, &d.msg)
		}
		l.delivered = l.buf[n-1].offset + 1
		rest := copy(l.buf, l.buf[n:])
		clear(l.buf[rest:])
		l.buf = l.buf[:rest]
		if rest == 0 && l.fetched > l.delivered {
			l.delivered = l.fetched // past the records dropped after the last one
		}
		if l.full {
			l.full = false
			close(l.space)
		}
	}
	return msgs
}

// nextOffset is the partition's commit point once the messages of batch
// that are in acked have committed: the lowest offset still outstanding (in
// the retry slot, or in batch but not acked), else the offset after the last
// record handed out.
func (l *lane) nextOffset(batch []*consumer.Message, acked map[*consumer.Message]struct{}) int64 {
	next := l.delivered
	low := func(off int64) {
		if next < 0 || off < next {
			next = off
		}
	}
	for _, r := range l.retries {
		low(r.d.offset)
	}
	for _, m := range batch {
		if _, ok := acked[m]; !ok {
			low(m.SourceData.(*delivery).offset)
		}
	}
	return next
}

// skipTo records that the pump fetched everything below next. When l is
// idle (nothing in flight, nothing to retry, nothing buffered) everything
// below its delivered offset is settled, including the records the fetcher
// dropped at the end of what it fetched (control records, records of
// aborted transactions): the commit point moves there, and skipTo returns
// it as the offset to store when the offsets table (store) does not hold
// it yet, so that a restart does not fetch those records again.
func (l *lane) skipTo(next int64, store bool) (target int64, write bool) {
	l.fetched = max(l.fetched, next)
	if len(l.buf) == 0 {
		l.delivered = max(l.delivered, l.fetched)
	}
	if !l.fetchable() || len(l.buf) > 0 || len(l.retries) > 0 || l.delivered < 0 {
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

// settle records the outcome of l's in-flight batch: retried messages wait
// in the retry slot for their delay, abandoned ones are due at once, and
// the commit point moves up. With store (offsets in Postgres) a batch with
// acked messages committed the offset its BeforeCommit wrote.
func (l *lane) settle(b *consumer.Batch, acked map[*consumer.Message]struct{}, retry []consumer.Retry, now time.Time, store bool) {
	retried := make(map[*consumer.Message]struct{}, len(retry))
	for _, r := range retry {
		d, ok := r.Message.SourceData.(*delivery)
		if !ok || d.lane != l {
			continue
		}
		if _, dup := retried[r.Message]; dup {
			continue
		}
		retried[r.Message] = struct{}{}
		l.retries = append(l.retries, retrySlot{d: d, due: now.Add(r.Delay)})
	}
	for _, m := range b.Messages {
		_, a := acked[m]
		_, r := retried[m]
		if !a && !r {
			l.retries = append(l.retries, retrySlot{d: m.SourceData.(*delivery), due: now})
		}
	}
	sort.Slice(l.retries, func(i, j int) bool { return l.retries[i].d.offset < l.retries[j].d.offset })
	if store && len(acked) > 0 {
		l.persisted = max(l.persisted, l.writing)
	}
	if next := l.nextOffset(nil, nil); next > l.committed {
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
// not yet committed were delivered.
func (s *Source) rememberCounts(l *lane) {
	tp := topicPartition{l.topic, l.partition}
	c := s.counts[tp]
	if c == nil {
		c = &deliveryCounts{upTo: -1, times: map[int64]int{}}
		s.counts[tp] = c
	}
	c.upTo = max(c.upTo, l.delivered)
	note := func(d *delivery) {
		if d.msg.Attempt > 1 && d.msg.Attempt > c.times[d.offset] {
			c.times[d.offset] = d.msg.Attempt
		}
	}
	for _, r := range l.retries {
		note(r.d)
	}
	if l.inFlight != nil {
		for _, m := range l.inFlight.Messages {
			if d, ok := m.SourceData.(*delivery); ok {
				note(d)
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
