// Package consumertest provides Broker, an in-memory message source that
// behaves like an at-least-once broker, for testing consumers and handlers
// without Kafka or SQS: it delivers some messages twice, redelivers what a
// crashed consumer had not acknowledged, loses acknowledgements, and honours
// retry delays, while keeping each lane in order. On request its refs are
// hostile: not valid text (BinaryRefs), or recurring when a lane restarts
// its offsets (RestartOffsetsEvery).
package consumertest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/effectively-once/effectively/consumer"
)

// Config configures a Broker. The zero value is a well-behaved broker with
// four lanes that never duplicates or loses anything.
type Config struct {
	// Lanes is the number of ordered lanes. Defaults to 4.
	Lanes int
	// DuplicateRate is the probability that a delivered message is
	// delivered once more, a little later in its lane.
	DuplicateRate float64
	// LostAckRate is the probability that a settled batch's acknowledgements
	// are lost, as when a consumer crashes after its commit and before its
	// ack: the lane then redelivers everything it has not acknowledged.
	LostAckRate float64
	// Seed seeds the broker's randomness. Defaults to 1.
	Seed uint64
	// Source is the Message.Source of delivered messages. Defaults to "test".
	Source string
	// BinaryRefs makes refs that are not valid text: the refs of four
	// neighbouring messages of a lane differ only in a suffix of NUL bytes
	// or bytes that are not valid UTF-8 (see Ref). Defaults to false: refs
	// are "lane-N@offset".
	BinaryRefs bool
	// RestartOffsetsEvery makes each lane start its offsets again at 0
	// after this many messages, as a Kafka topic that is deleted and created
	// again does: refs recur, each naming several different messages over
	// time. Defaults to 0: offsets never restart.
	RestartOffsetsEvery int
}

// Stats counts what the broker did.
type Stats struct {
	Published, Delivered, Duplicated, Acked, Retried, LostAcks, Crashes int
}

type entry struct {
	tmpl       consumer.Message
	offset     int // in the lane's current numbering: see Config.RestartOffsetsEvery
	acked      bool
	deliveries int
}

type delayed struct {
	e   *entry
	due time.Time
}

type lane struct {
	name     string
	log      []*entry
	queue    []*entry // deliveries waiting, in order
	delayed  []delayed
	inflight *consumer.Batch
}

type batchData struct {
	epoch int
	lane  *lane
}

// Broker is an in-memory consumer.Source. It is safe for concurrent use.
type Broker struct {
	cfg     Config
	mu      sync.Mutex
	rng     *rand.Rand
	lanes   []*lane
	next    int // lane to try first, for fairness
	epoch   int // bumped by Crash: settles of older batches are ignored
	unacked int
	wake    chan struct{}
	stats   Stats
}

var _ consumer.Source = (*Broker)(nil)

// New returns a Broker.
func New(cfg Config) *Broker {
	if cfg.Lanes <= 0 {
		cfg.Lanes = 4
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	if cfg.Source == "" {
		cfg.Source = "test"
	}
	b := &Broker{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)), wake: make(chan struct{})}
	for i := range cfg.Lanes {
		b.lanes = append(b.lanes, &lane{name: fmt.Sprintf("lane-%d", i)})
	}
	return b
}

// Publish appends a message to a lane (taken modulo the number of lanes).
// Source, Lane, Ref and Attempt are set by the broker; the rest of m is
// delivered as given. Each delivery is a fresh copy.
func (b *Broker) Publish(laneIdx int, m consumer.Message) {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.lanes[laneIdx%len(b.lanes)]
	e := &entry{tmpl: m, offset: len(l.log)}
	if n := b.cfg.RestartOffsetsEvery; n > 0 {
		e.offset %= n
	}
	e.tmpl.Source = b.cfg.Source
	e.tmpl.Lane = l.name
	e.tmpl.Ref = Ref(l.name, e.offset, b.cfg.BinaryRefs)
	if e.tmpl.Time.IsZero() {
		e.tmpl.Time = time.Now()
	}
	l.log = append(l.log, e)
	l.queue = append(l.queue, e)
	b.stats.Published++
	b.unacked++
	b.signal()
}

// Crash simulates the consumer process dying: batches in flight are
// forgotten (their Settle calls are ignored) and every lane delivers again,
// in order, each message it has not had acknowledged.
func (b *Broker) Crash() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.epoch++
	b.stats.Crashes++
	for _, l := range b.lanes {
		b.rewind(l)
	}
	b.signal()
}

// rewind requeues every unacknowledged message of l in log order.
func (b *Broker) rewind(l *lane) {
	l.inflight = nil
	l.delayed = nil
	l.queue = l.queue[:0]
	for _, e := range l.log {
		if !e.acked {
			l.queue = append(l.queue, e)
		}
	}
}

// Unacked returns how many published messages are not yet acknowledged.
func (b *Broker) Unacked() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.unacked
}

// Idle reports whether every published message was acknowledged and no
// delivery (duplicate, retry) is waiting or in flight.
func (b *Broker) Idle() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.unacked > 0 {
		return false
	}
	for _, l := range b.lanes {
		if l.inflight != nil || len(l.queue) > 0 || len(l.delayed) > 0 {
			return false
		}
	}
	return true
}

// WaitIdle blocks until the broker is Idle, or ctx is done.
func (b *Broker) WaitIdle(ctx context.Context) error {
	for {
		if b.Idle() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("consumertest: %d messages still unacknowledged: %w", b.Unacked(), ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Redelivered returns how many published messages were delivered more than once.
func (b *Broker) Redelivered() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, l := range b.lanes {
		for _, e := range l.log {
			if e.deliveries > 1 {
				n++
			}
		}
	}
	return n
}

// Stats returns the broker's counters.
func (b *Broker) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

// signal wakes blocked Fetch calls. b.mu must be held.
func (b *Broker) signal() {
	close(b.wake)
	b.wake = make(chan struct{})
}

// Fetch implements consumer.Source.
func (b *Broker) Fetch(ctx context.Context, max int) (*consumer.Batch, error) {
	if max <= 0 {
		max = 1
	}
	for {
		b.mu.Lock()
		batch, wait := b.take(max)
		wake := b.wake
		b.mu.Unlock()
		if batch != nil {
			return batch, nil
		}
		var timer *time.Timer
		var due <-chan time.Time
		if wait > 0 {
			timer = time.NewTimer(wait)
			due = timer.C
		}
		select {
		case <-ctx.Done():
		case <-wake:
		case <-due:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}

// take returns a batch from a free lane, or how long until a delayed
// message is due (0: nothing is due). b.mu must be held.
func (b *Broker) take(max int) (*consumer.Batch, time.Duration) {
	now := time.Now()
	var wait time.Duration
	for i := range b.lanes {
		l := b.lanes[(b.next+i)%len(b.lanes)]
		if l.inflight != nil {
			continue
		}
		// Due retries go back into the queue in lane order, ahead of the
		// messages not delivered yet (consumer.Source's order).
		kept := l.delayed[:0]
		for _, d := range l.delayed {
			if !d.due.After(now) {
				l.requeue(d.e)
			} else {
				kept = append(kept, d)
				if w := d.due.Sub(now); wait == 0 || w < wait {
					wait = w
				}
			}
		}
		l.delayed = kept
		if len(l.queue) == 0 {
			continue
		}
		n := min(max, len(l.queue))
		taken := append([]*entry(nil), l.queue[:n]...)
		l.queue = append(l.queue[:0], l.queue[n:]...)
		batch := &consumer.Batch{Lane: l.name, SourceData: batchData{epoch: b.epoch, lane: l}}
		for _, e := range taken {
			e.deliveries++
			m := e.delivery()
			m.Attempt = e.deliveries
			m.SourceData = e
			batch.Messages = append(batch.Messages, &m)
			b.stats.Delivered++
			if b.cfg.DuplicateRate > 0 && b.rng.Float64() < b.cfg.DuplicateRate {
				// Deliver it again somewhere later in the lane.
				pos := len(l.queue)
				if pos > 0 {
					pos = b.rng.IntN(pos + 1)
				}
				l.queue = append(l.queue, nil)
				copy(l.queue[pos+1:], l.queue[pos:])
				l.queue[pos] = e
				b.stats.Duplicated++
			}
		}
		l.inflight = batch
		b.next = (b.next + i + 1) % len(b.lanes)
		return batch, 0
	}
	return nil, wait
}

// requeue puts e back into l's queue before the first message that comes
// after it in the lane. Broker.mu must be held.
func (l *lane) requeue(e *entry) {
	i := 0
	for i < len(l.queue) && l.queue[i].offset < e.offset {
		i++
	}
	l.queue = slices.Insert(l.queue, i, e)
}

// Settle implements consumer.Source.
func (b *Broker) Settle(_ context.Context, batch *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	bd, ok := batch.SourceData.(batchData)
	if !ok {
		return fmt.Errorf("consumertest: batch was not fetched from this broker")
	}
	l := bd.lane
	if bd.epoch != b.epoch || l.inflight != batch {
		return nil // fetched before a crash: the ack is lost
	}
	l.inflight = nil
	defer b.signal()
	if b.cfg.LostAckRate > 0 && b.rng.Float64() < b.cfg.LostAckRate {
		b.stats.LostAcks++
		b.rewind(l)
		return nil
	}
	for _, m := range ack {
		e := m.SourceData.(*entry)
		if !e.acked {
			e.acked = true
			b.stats.Acked++
			b.unacked--
		}
	}
	now := time.Now()
	for _, r := range retry {
		e := r.Message.SourceData.(*entry)
		l.delayed = append(l.delayed, delayed{e: e, due: now.Add(r.Delay)})
		b.stats.Retried++
	}
	// Messages neither acknowledged nor retried were abandoned: deliver them
	// again as after a crash of this lane.
	settled := make(map[*entry]bool, len(ack)+len(retry))
	for _, m := range ack {
		settled[m.SourceData.(*entry)] = true
	}
	for _, r := range retry {
		settled[r.Message.SourceData.(*entry)] = true
	}
	var abandoned []*entry
	for _, m := range batch.Messages {
		if e := m.SourceData.(*entry); !settled[e] && !e.acked {
			abandoned = append(abandoned, e)
		}
	}
	if len(abandoned) > 0 {
		l.queue = append(abandoned, l.queue...)
	}
	return nil
}
