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
	"sync"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/lanes"
)

// Config configures a Broker. The zero value is a well-behaved broker with
// four lanes that never duplicates or loses anything.
type Config struct {
	// Lanes is the number of ordered lanes. Defaults to 4.
	Lanes int
	// DuplicateRate is the probability that a delivered message is
	// delivered once more, later in its lane: after the messages of the
	// lane that wait for delivery when it is handed out.
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

type lane struct {
	name string
	log  []*entry
}

// Broker is an in-memory consumer.Source. It is safe for concurrent use.
// Its lanes are scheduled by a lanes.Lanes, as every source's are: the
// broker only keeps the log, acknowledgements and its faults.
type Broker struct {
	cfg     Config
	sched   *lanes.Lanes
	mu      sync.Mutex // guards what follows; held while calling sched, never taken by it
	rng     *rand.Rand
	lanes   []*lane
	unacked int
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
	b := &Broker{cfg: cfg, sched: lanes.New(lanes.Config{}),
		rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
	for i := range cfg.Lanes {
		l := &lane{name: fmt.Sprintf("lane-%d", i)}
		b.lanes = append(b.lanes, l)
		b.sched.Open(l.name, l)
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
	b.stats.Published++
	b.unacked++
	b.sched.Add(l.name, e.ticket())
}

// ticket stands for a delivery of e in the scheduler; Fetch turns it into
// the delivery, a fresh copy.
func (e *entry) ticket() *consumer.Message { return &consumer.Message{SourceData: e} }

// Crash simulates the consumer process dying: batches in flight are
// forgotten (their Settle calls are ignored) and every lane delivers again,
// in order, each message it has not had acknowledged.
func (b *Broker) Crash() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stats.Crashes++
	for _, l := range b.lanes {
		b.sched.Reset(l.name, nil, l.unacked())
	}
}

// unacked returns a new delivery of every unacknowledged message of l, in
// log order. Broker.mu must be held.
func (l *lane) unacked() []*consumer.Message {
	var out []*consumer.Message
	for _, e := range l.log {
		if !e.acked {
			out = append(out, e.ticket())
		}
	}
	return out
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
	return b.unacked == 0 && b.sched.Idle()
}

// WaitIdle blocks until the broker is Idle, or ctx is done.
func (b *Broker) WaitIdle(ctx context.Context) error {
	for {
		changed := b.sched.Changed() // every change of Idle's answer changes the lanes
		if b.Idle() {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("consumertest: %d messages still unacknowledged: %w", b.Unacked(), ctx.Err())
		case <-changed:
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

// Fetch implements consumer.Source.
func (b *Broker) Fetch(ctx context.Context, max int) (*consumer.Batch, error) {
	batch, err := b.sched.Next(ctx, max)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, m := range batch.Messages {
		e := m.SourceData.(*entry)
		e.deliveries++
		// The ticket becomes this delivery: each ticket is handed out
		// once, so a handler's changes reach no other delivery.
		*m = e.delivery()
		m.SourceData = e
		m.Attempt = e.deliveries
		b.stats.Delivered++
		if b.cfg.DuplicateRate > 0 && b.rng.Float64() < b.cfg.DuplicateRate {
			// Deliver it again later in the lane.
			b.sched.Add(batch.Lane, e.ticket())
			b.stats.Duplicated++
		}
	}
	return batch, nil
}

// Settle implements consumer.Source.
func (b *Broker) Settle(_ context.Context, batch *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	l, ok := batch.SourceData.(*lane)
	if !ok {
		return fmt.Errorf("consumertest: batch was not fetched from this broker")
	}
	if b.sched.Lane(l.name).InFlight != batch {
		return nil // fetched before a crash: the ack is lost
	}
	if b.cfg.LostAckRate > 0 && b.rng.Float64() < b.cfg.LostAckRate {
		b.stats.LostAcks++
		b.sched.Reset(l.name, batch, l.unacked())
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
	b.stats.Retried += len(retry)
	// Messages neither acknowledged nor retried were abandoned: the
	// scheduler delivers them again at once, as after a crash of this lane.
	b.sched.Settle(batch, ack, retry)
	return nil
}
