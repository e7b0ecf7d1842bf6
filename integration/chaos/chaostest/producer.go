package chaostest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/effectively-once/effectively/integration/chaos"
	"github.com/twmb/franz-go/pkg/kgo"
)

// laneKey is one partition of a topic.
type laneKey struct {
	topic     string
	partition int32
}

func (l laneKey) String() string { return fmt.Sprintf("%s/%d", l.topic, l.partition) }

// producer writes the logical messages with franz-go (a producer the
// library's authors did not write), at a set rate or as fast as it can,
// with producer duplicates (the same idempotency key and payload sent again
// later, now and then to another partition of the topic) and poison
// messages. It remembers where each logical message went and how far each
// partition's log reaches.
type producer struct {
	cl    *kgo.Client
	rng   *rand.Rand // used by the run goroutine only
	total int
	plan  plan

	mu      sync.Mutex
	lanes   []laneKey // partitions new messages go to
	ends    map[laneKey]int64
	logical int // logical messages produced (first copies handed to the client)
	records int // records acknowledged
	dupSent int
	rate    float64 // logical messages per second while paced
	paceCap int     // paced production stops at this many logical messages
	flushAt int     // produce without pacing up to this many logical messages
	pending []*kgo.Record
	dups    []dueDup
	seq     int // records generated, for dup scheduling
	// Per logical message: the lane of its first copy, and whether it is poison.
	laneOf []laneKey
	poison []bool
	failed int // produce errors retried
	wake   chan struct{}
}

type dueDup struct {
	due int
	rec *kgo.Record
}

func newProducer(brokers []string, pl plan, lanes []laneKey) (*producer, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.MetadataMinAge(250*time.Millisecond),
		kgo.MetadataMaxAge(2*time.Second),
		kgo.RecordDeliveryTimeout(time.Minute),
	)
	if err != nil {
		return nil, err
	}
	return &producer{
		cl: cl, rng: rand.New(rand.NewPCG(uint64(pl.seed), 1)), total: pl.messages, plan: pl,
		lanes: lanes, ends: map[laneKey]int64{}, wake: make(chan struct{}, 1),
		laneOf: make([]laneKey, 0, pl.messages), poison: make([]bool, 0, pl.messages),
	}, nil
}

func (p *producer) close() { p.cl.Close() }

// addLanes makes new messages go to lanes too.
func (p *producer) addLanes(lanes ...laneKey) {
	p.mu.Lock()
	p.lanes = append(p.lanes, lanes...)
	p.mu.Unlock()
	p.cl.ForceMetadataRefresh()
}

// setRate paces the producer at rate logical messages per second, up to
// limit logical messages.
func (p *producer) setRate(rate float64, limit int) {
	p.mu.Lock()
	p.rate, p.paceCap = rate, limit
	p.mu.Unlock()
	p.poke()
}

// flushTo produces, unpaced, until n logical messages (and every
// scheduled duplicate, once n is the total) are out.
func (p *producer) flushTo(n int) {
	p.mu.Lock()
	p.flushAt = max(p.flushAt, min(n, p.total))
	p.mu.Unlock()
	p.poke()
}

func (p *producer) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// status returns the logical messages and records produced so far.
func (p *producer) status() (logical, records, dups int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logical, p.records, p.dupSent
}

// done reports whether every logical message and duplicate is acknowledged.
func (p *producer) done() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logical == p.total && len(p.dups) == 0 && len(p.pending) == 0
}

// endsSnapshot returns each partition's log end as far as acknowledged
// records show it.
func (p *producer) endsSnapshot() map[laneKey]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[laneKey]int64, len(p.ends))
	for k, v := range p.ends {
		out[k] = v
	}
	return out
}

// run produces until ctx is done or everything is out.
func (p *producer) run(ctx context.Context, logf func(string, ...any)) {
	const tick = 50 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	var credit float64
	last := time.Now()
	for ctx.Err() == nil && !p.done() {
		p.mu.Lock()
		now := time.Now()
		n := 0
		switch {
		case p.flushAt > p.logical:
			n = min(p.flushAt-p.logical, 2000)
			credit = 0
		case p.flushAt >= p.total:
			n = 2000 // only duplicates and retries are left
		case p.rate > 0:
			credit += p.rate * now.Sub(last).Seconds()
			n = int(credit)
			credit -= float64(n)
			n = max(min(n, p.paceCap-p.logical), 0)
		}
		last = now
		recs := p.generateLocked(n)
		p.mu.Unlock()
		if len(recs) == 0 {
			select {
			case <-ctx.Done():
			case <-t.C:
			case <-p.wake:
			}
			continue
		}
		res := p.cl.ProduceSync(ctx, recs...)
		p.mu.Lock()
		var failed []*kgo.Record
		for _, r := range res {
			if r.Err != nil {
				// Not acknowledged: sent again (if the broker did write it,
				// that is one more producer duplicate).
				failed = append(failed, r.Record)
				continue
			}
			k := laneKey{r.Record.Topic, r.Record.Partition}
			p.ends[k] = max(p.ends[k], r.Record.Offset+1)
			p.records++
		}
		p.pending = append(p.pending, failed...)
		p.failed += len(failed)
		p.mu.Unlock()
		if len(failed) > 0 {
			logf("producer: %d records not acknowledged (%v), sending them again", len(failed), firstErr(res))
			p.cl.ForceMetadataRefresh()
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
}

func firstErr(res kgo.ProduceResults) error {
	for _, r := range res {
		if r.Err != nil {
			return r.Err
		}
	}
	return nil
}

// generateLocked returns up to n new logical messages, with the retries
// and the duplicates that are due mixed in.
func (p *producer) generateLocked(n int) []*kgo.Record {
	out := p.pending
	p.pending = nil
	for made := 0; made < n || (p.logical == p.total && len(p.dups) > 0 && len(out) < 2000); {
		if len(p.dups) > 0 && (p.dups[0].due <= p.seq || p.logical == p.total) {
			out = append(out, p.dups[0].rec)
			p.dups = p.dups[1:]
			p.dupSent++
			p.seq++
			continue
		}
		if p.logical == p.total {
			break
		}
		i := p.logical
		p.logical++
		made++
		lane := p.lanes[p.rng.IntN(len(p.lanes))]
		poison := p.rng.Float64() < p.plan.poisonRate
		p.laneOf = append(p.laneOf, lane)
		p.poison = append(p.poison, poison)
		out = append(out, p.record(i, lane, poison))
		p.seq++
		if p.rng.Float64() < p.plan.dupRate {
			dl := lane
			if p.rng.IntN(4) == 0 { // a retry after a repartition lands elsewhere
				var same []laneKey
				for _, l := range p.lanes {
					if l.topic == lane.topic {
						same = append(same, l)
					}
				}
				dl = same[p.rng.IntN(len(same))]
			}
			p.insertDup(dueDup{due: p.seq + 1 + p.rng.IntN(3000), rec: p.record(i, dl, poison)})
		}
	}
	return out
}

func (p *producer) insertDup(d dueDup) {
	i := len(p.dups)
	for i > 0 && p.dups[i-1].due > d.due {
		i--
	}
	p.dups = append(p.dups, dueDup{})
	copy(p.dups[i+1:], p.dups[i:])
	p.dups[i] = d
}

func msgID(i int) string { return fmt.Sprintf("m-%07d", i) }

func (p *producer) record(i int, lane laneKey, poison bool) *kgo.Record {
	id := msgID(i)
	r := &kgo.Record{
		Topic: lane.topic, Partition: lane.partition,
		Key:     []byte(id),
		Value:   fmt.Appendf(nil, `{"n":%d}`, i),
		Headers: []kgo.RecordHeader{{Key: chaos.IDHeader, Value: []byte(id)}},
	}
	if poison {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: chaos.PoisonHeader, Value: []byte("1")})
	}
	return r
}
