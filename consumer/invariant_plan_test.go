package consumer_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/effectively-once/effectively/consumer"
)

// The plan of one invariant run: which logical messages exist, what each
// one is (good or one of the poison kinds), its value, its producer copies
// and where they sit in their lane, and which faults strike which delivery.
// Everything in it follows from the seed, so a run can be replayed; only
// the interleaving of lanes and goroutines is left to the scheduler.

// kind is what a logical message does to its handler.
type kind uint8

const (
	// good: must end with exactly one effect.
	good kind = iota
	// poisonPermanent: the handler returns a permanent error; parked at
	// once, with its marker.
	poisonPermanent
	// poisonExhaust: the handler fails with a retryable error every time;
	// parked after Config.MaxAttempts, with its marker.
	poisonExhaust
	// poisonCommit: the handler succeeds, but its row breaks a deferred
	// foreign key, so the COMMIT fails; must end parked, with no effect.
	poisonCommit
	// poisonKey: no usable dedupe key (no ID for idset and bloom, a
	// malformed seq for highwater); parked without a marker, so each copy
	// is parked on its own. It takes no place in its sender's numbering.
	poisonKey
)

func (k kind) String() string {
	return [...]string{"good", "poison-permanent", "poison-exhaust", "poison-commit", "poison-key"}[k]
}

func (k kind) poison() bool { return k != good }

// withMarker reports whether a parked message of this kind is parked with
// its dedupe marker, so that every later copy is a duplicate.
func (k kind) withMarker() bool { return k.poison() && k != poisonKey }

// fault is what strikes one delivery of a stored message.
type fault uint8

const (
	_ fault = iota // no fault: the zero value of a delivery without one
	// killHandler: the handler terminates its own connection's backend
	// (from the admin connection) before writing.
	killHandler
	// crashHandler: the broker crashes (forgets what is in flight) and the
	// handler fails, as when the process dies mid-handler.
	crashHandler
	// killCommit: right before COMMIT, the batch's backend is terminated
	// after a short delay, so the kill lands before, during or after it.
	killCommit
	// dropCommit: the consumer's side of the connection is closed right
	// after it sent COMMIT, before the answer: the server commits, the
	// consumer sees an error. The outcome is unknown to the consumer, and
	// redelivery must resolve it (duplicate, since it committed).
	dropCommit
)

func (f fault) String() string {
	return [...]string{"none", "kill-handler", "crash-handler", "kill-commit", "drop-commit"}[f]
}

// logical is one message as its producer meant it. Its copies are the
// stored messages the broker holds for it: the original and its producer
// copies (each with its own Ref, the same key and the same value).
type logical struct {
	id     string // also the dedupe ID for idset and bloom
	kind   kind
	sender string
	seq    int64 // 0 for poisonKey
	value  []byte
	// transient: the handler fails this many deliveries of the message (of
	// any of its copies), and only deliveries with an Attempt of at most
	// transientAttempts, so that no good message runs out of attempts
	// (good messages only). A delivery that failed fails every time its
	// batch runs it.
	transient int
	copies    []*stored
}

// stored is one stored message: a copy of a logical message in a lane.
type stored struct {
	serial  int // unique in the run; the x-copy header
	logical *logical
	lane    int
	faults  map[int]fault // delivery attempt → fault
	// delay is how long after BeforeCommit a killCommit fault terminates
	// the backend.
	delay int // microseconds
}

// msg is the message published for s.
func (s *stored) msg() consumer.Message {
	l := s.logical
	seq := strconv.FormatInt(l.seq, 10)
	id := l.id
	if l.kind == poisonKey {
		seq, id = "not-a-number", ""
	}
	return consumer.Message{
		ID:    id,
		Value: l.value,
		Headers: []consumer.Header{
			{Key: "sender", Value: []byte(l.sender)},
			{Key: "seq", Value: []byte(seq)},
			{Key: "x-logical", Value: []byte(l.id)},
			{Key: "x-copy", Value: []byte(strconv.Itoa(s.serial))},
		},
	}
}

// plan is everything a run publishes, and its knobs.
type plan struct {
	seed     uint64
	lanes    int
	logicals []*logical
	stored   []*stored   // by serial
	order    [][]*stored // per lane, in publish order
	// killAllAt: after these batch numbers (counted over the whole run), the
	// admin connection terminates every backend of the consumer's pool.
	killAllAt map[int]bool
	// lifetimes: each consumer lifetime is stopped after this many batches
	// (the last value repeats).
	lifetimes []int
	batchSize int
	dupRate   float64
	lostAck   float64
	binary    bool
	recurEach int
}

// planOptions turns parts of the generator off, to tell one failure mode
// from another (see INVARIANT_OFF). The zero value turns nothing off.
type planOptions struct {
	noCopies, noBinaryRefs, noRecurringRefs, noNil, noRetryable     bool
	noPoisonPermanent, noPoisonExhaust, noPoisonCommit, noPoisonKey bool
	noKillHandler, noKillCommit, noDropCommit, noKillAll, noCrash   bool
	noLostAcks, noRestarts                                          bool
}

const (
	planLanes   = 4
	planSenders = 8 // sender i publishes to lane i%planLanes, like a Kafka key
)

// newPlan draws the plan of a run from its seed.
func newPlan(seed uint64, o planOptions) *plan {
	rng := rand.New(rand.NewPCG(seed, 0x1a7a41a7))
	p := &plan{seed: seed, lanes: planLanes, killAllAt: map[int]bool{}}
	p.batchSize = []int{1, 4, 5, 6, 8, 10, 16, 50}[rng.IntN(8)]
	p.dupRate = 0.1 + 0.2*rng.Float64()
	if !o.noLostAcks {
		p.lostAck = 0.03 + 0.07*rng.Float64()
	}
	p.binary = !o.noBinaryRefs && rng.IntN(2) == 0
	if !o.noRecurringRefs && rng.IntN(2) == 0 {
		p.recurEach = 8 + rng.IntN(25)
	}

	// Logical messages: n per run, numbered per sender without holes (strict
	// highwater needs that), with a few of each poison kind at random places.
	n := 50 + rng.IntN(50)
	if p.batchSize == 1 {
		n /= 2 // a transaction per delivery
	}
	kinds := make([]kind, n)
	want := []struct {
		k   kind
		off bool
		n   int
	}{
		{poisonPermanent, o.noPoisonPermanent, 2 + rng.IntN(3)},
		{poisonExhaust, o.noPoisonExhaust, 1 + rng.IntN(2)},
		{poisonCommit, o.noPoisonCommit, 1 + rng.IntN(2)},
	}
	for _, w := range want {
		for range w.n {
			if w.off {
				break
			}
			for {
				if i := rng.IntN(n); kinds[i] == good {
					kinds[i] = w.k
					break
				}
			}
		}
	}
	seqs := map[string]int64{}
	for i := range n {
		l := &logical{id: fmt.Sprintf("m%d", i), kind: kinds[i], sender: fmt.Sprintf("s%d", rng.IntN(planSenders))}
		seqs[l.sender]++
		l.seq = seqs[l.sender]
		p.logicals = append(p.logicals, l)
	}
	if !o.noPoisonKey {
		for j := range 1 + rng.IntN(2) {
			p.logicals = append(p.logicals, &logical{id: fmt.Sprintf("k%d", j), kind: poisonKey, sender: fmt.Sprintf("s%d", rng.IntN(planSenders))})
		}
	}
	for _, l := range p.logicals {
		switch r := rng.IntN(100); {
		case !o.noNil && r < 12:
			l.value = nil
		case !o.noNil && r < 20:
			l.value = []byte{}
		default:
			l.value = fmt.Appendf(nil, `{"id":%q,"sender":%q,"seq":%d}`, l.id, l.sender, l.seq)
		}
		if l.kind == good && !o.noRetryable && rng.IntN(100) < 25 {
			l.transient = 1 + rng.IntN(2)
		}
	}
	if !o.noNil {
		// At least one poison and one good message with a nil value, so
		// every run checks that nil survives the effects and the parked table.
		p.forceNil(rng, true)
		p.forceNil(rng, false)
	}

	// Lanes: each lane's senders interleaved at random, each sender in
	// order; poison-key messages anywhere among their sender's; producer
	// copies at random later places in the same lane.
	bySender := map[string][]*logical{}
	var senders []string
	for _, l := range p.logicals {
		if bySender[l.sender] == nil {
			senders = append(senders, l.sender)
		}
		ls := bySender[l.sender]
		at := len(ls)
		if l.kind == poisonKey { // anywhere among its sender's messages
			at = rng.IntN(len(ls) + 1)
		}
		bySender[l.sender] = append(ls[:at], append([]*logical{l}, ls[at:]...)...)
	}
	p.order = make([][]*stored, p.lanes)
	laneOf := func(sender string) int {
		i, _ := strconv.Atoi(sender[1:])
		return i % p.lanes
	}
	for lane := range p.lanes {
		var mine []string
		for _, s := range senders {
			if laneOf(s) == lane {
				mine = append(mine, s)
			}
		}
		var seq []*stored
		for len(mine) > 0 {
			i := rng.IntN(len(mine))
			s := mine[i]
			l := bySender[s][0]
			if bySender[s] = bySender[s][1:]; len(bySender[s]) == 0 {
				mine = append(mine[:i], mine[i+1:]...)
			}
			seq = append(seq, p.newStored(l, lane))
		}
		// Producer copies, each at a random place after the original.
		for _, orig := range append([]*stored(nil), seq...) {
			copies := 0
			if !o.noCopies {
				switch r := rng.IntN(100); {
				case r < 10:
					copies = 2
				case r < 50:
					copies = 1
				}
				if orig.logical.kind.poison() && rng.IntN(2) == 0 {
					copies++ // poison copies test "parked once, copies are duplicates"
				}
			}
			for range copies {
				// Mostly soon after the original, as a producer's retry is;
				// sometimes anywhere later.
				i := indexOf(seq, orig)
				at := i + 1 + rng.IntN(len(seq)-i)
				if rng.IntN(10) < 7 {
					at = min(len(seq), i+1+rng.IntN(6))
				}
				c := p.newStored(orig.logical, lane)
				seq = append(seq[:at], append([]*stored{c}, seq[at:]...)...)
			}
		}
		p.order[lane] = seq
	}

	// Faults, by stored message and delivery.
	for _, s := range p.stored {
		s.faults = map[int]fault{}
		s.delay = rng.IntN(3000)
		if r := rng.IntN(1000); !o.noKillHandler && r < 25 {
			s.faults[1+rng.IntN(2)] = killHandler
		} else if !o.noCrash && r < 40 {
			s.faults[1+rng.IntN(2)] = crashHandler
		} else if !o.noKillCommit && r < 80 {
			s.faults[1] = killCommit
		} else if !o.noDropCommit && r < 100 {
			s.faults[1] = dropCommit
		}
	}
	if !o.noKillAll {
		for range 1 + rng.IntN(3) {
			p.killAllAt[5+rng.IntN(60)] = true
		}
	}
	p.lifetimes = []int{1 << 30}
	if !o.noRestarts {
		p.lifetimes = []int{15 + rng.IntN(40), 15 + rng.IntN(60), 40 + rng.IntN(100), 1 << 30}
	}
	return p
}

func (p *plan) newStored(l *logical, lane int) *stored {
	s := &stored{serial: len(p.stored), logical: l, lane: lane}
	p.stored = append(p.stored, s)
	l.copies = append(l.copies, s)
	return s
}

// forceNil gives a nil value to a random message that is poison (or good).
func (p *plan) forceNil(rng *rand.Rand, poison bool) {
	var pick []*logical
	for _, l := range p.logicals {
		if l.kind.poison() == poison {
			if l.value == nil {
				return
			}
			pick = append(pick, l)
		}
	}
	if len(pick) > 0 {
		pick[rng.IntN(len(pick))].value = nil
	}
}

func indexOf(seq []*stored, s *stored) int {
	for i, x := range seq {
		if x == s {
			return i
		}
	}
	return -1
}

// count returns how many logical messages are of kind k, and how many
// stored messages they have.
func (p *plan) count(k kind) (logicals, copies int) {
	for _, l := range p.logicals {
		if l.kind == k {
			logicals++
			copies += len(l.copies)
		}
	}
	return logicals, copies
}

func (p *plan) String() string {
	nil_, empty := 0, 0
	for _, l := range p.logicals {
		switch {
		case l.value == nil:
			nil_++
		case len(l.value) == 0:
			empty++
		}
	}
	s := fmt.Sprintf("seed %d: %d logical messages in %d stored (batch %d, dup %.2f, lost acks %.2f, binary refs %v, offsets restart every %d; %d nil, %d empty",
		p.seed, len(p.logicals), len(p.stored), p.batchSize, p.dupRate, p.lostAck, p.binary, p.recurEach, nil_, empty)
	for k := poisonPermanent; k <= poisonKey; k++ {
		l, c := p.count(k)
		s += fmt.Sprintf(", %d %s (%d stored)", l, k, c)
	}
	return s + ")"
}
