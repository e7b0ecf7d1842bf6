package bench

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effectively-once/effectively/consumer"
)

// commitClock is a consumer hook timing each applied message: when its
// batch started and when the batch's transaction committed (the end of
// the batch less its acknowledgement), against the SentAtHeader.
type commitClock struct {
	applied atomic.Int64
	all     chan struct{} // closed once want messages applied
	allOnce sync.Once

	mu      sync.Mutex
	want    int64
	w0, w1  time.Time
	starts  map[uint64]time.Time
	batches map[uint64]*batchTimes
	lat     []time.Duration // of the window's messages
	toStart []time.Duration
	inBatch []time.Duration
	// committed and the batch counts are of the batches that committed
	// within the window.
	committed, nBatches, batchMsgs int
	claim, handle, commit          time.Duration
	other                          int
	otherErr                       string
	// samples and lanes are for the tail profile: every window message
	// with its batch, and every lane's batches in the order they started.
	samples []sample
	lanes   map[string][]*batchTimes
}

type batchTimes struct {
	start, commit, end     time.Time
	left                   int // messages not yet reported
	lane                   string
	size                   int
	claim, handle, commit_ time.Duration
}

// sample is one window message's timing, for the tail profile.
type sample struct {
	sent time.Time
	b    *batchTimes
}

func newCommitClock() *commitClock {
	return &commitClock{all: make(chan struct{}), want: math.MaxInt64,
		starts: map[uint64]time.Time{}, batches: map[uint64]*batchTimes{}, lanes: map[string][]*batchTimes{}}
}

// set sets the window and the number of messages that ends the wait.
func (c *commitClock) set(w0, w1 time.Time, want int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.w0, c.w1, c.want = w0, w1, int64(want)
}

func (c *commitClock) BatchStart(ctx context.Context, b consumer.BatchInfo) context.Context {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.starts[b.Batch] = now
	return ctx
}

func (c *commitClock) BatchDone(_ context.Context, st *consumer.BatchStats) {
	end := time.Now()
	commit := end.Add(-st.Ack - st.Standby)
	c.mu.Lock()
	start := c.starts[st.Batch]
	delete(c.starts, st.Batch)
	if st.Err != nil {
		c.other++
		c.otherErr = st.Err.Error()
	}
	if left := st.Applied + st.Duplicate + st.Mismatch + st.Parked + st.Retried + st.Unknown; left > 0 {
		bt := &batchTimes{start: start, commit: commit, end: end, left: left, lane: st.Lane, size: st.Size,
			claim: st.Claim, handle: st.Handle, commit_: st.Commit}
		c.batches[st.Batch] = bt
		c.lanes[st.Lane] = append(c.lanes[st.Lane], bt)
	}
	if st.Err == nil && !commit.Before(c.w0) && commit.Before(c.w1) {
		c.committed += st.Applied
		c.nBatches++
		c.batchMsgs += st.Size
		c.claim += st.Claim
		c.handle += st.Handle
		c.commit += st.Commit
	}
	want := c.want
	c.mu.Unlock()
	if c.applied.Add(int64(st.Applied)) >= want {
		c.allOnce.Do(func() { close(c.all) })
	}
}

func (c *commitClock) MessageDone(_ context.Context, e consumer.MessageEvent) {
	var sent time.Time
	if v, ok := e.Message.Header(SentAtHeader); ok {
		if ns, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			sent = time.Unix(0, ns)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.batches[e.Batch]
	if b == nil {
		return
	}
	if b.left--; b.left == 0 {
		delete(c.batches, e.Batch)
	}
	if e.Outcome != consumer.OutcomeApplied {
		c.other++
		c.otherErr = e.Outcome.String()
		if e.Err != nil {
			c.otherErr += ": " + e.Err.Error()
		}
		return
	}
	if sent.IsZero() || sent.Before(c.w0) || !sent.Before(c.w1) {
		return
	}
	c.lat = append(c.lat, b.commit.Sub(sent))
	c.toStart = append(c.toStart, b.start.Sub(sent))
	c.inBatch = append(c.inBatch, b.commit.Sub(b.start))
	c.samples = append(c.samples, sample{sent: sent, b: b})
}

var (
	_ consumer.BatchStartHook = (*commitClock)(nil)
	_ consumer.MessageHook    = (*commitClock)(nil)
)

// result fills in r from what the clock saw of a window of length window
// in which inWindow messages were due.
func (c *commitClock) result(r *LatencyResult, window time.Duration, inWindow int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r.Samples = inWindow
	r.NotCommitted = max(0, inWindow-len(c.lat))
	r.Achieved = float64(c.committed) / window.Seconds()
	if c.nBatches > 0 {
		r.Batch = float64(c.batchMsgs) / float64(c.nBatches)
		n := time.Duration(c.nBatches)
		r.Claim, r.Handle, r.Commit = c.claim/n, c.handle/n, c.commit/n
	}
	r.Other, r.OtherErr = c.other, c.otherErr
	lat := slices.Clone(c.lat)
	for range r.NotCommitted {
		lat = append(lat, Undrained)
	}
	r.P50, r.P99, r.Max = percentile(lat, 50), percentile(lat, 99), percentile(lat, 100)
	r.ToStart, r.InBatch = percentile(slices.Clone(c.toStart), 50), percentile(slices.Clone(c.inBatch), 50)
	r.Tail = c.tail()
}

// tail profiles the slowest 1% of the window's messages: where their time
// went, on average. Busy is the part of the wait before their batch
// started during which their lane had an earlier batch in flight (from
// its start to its BatchDone); Before is the rest of that wait (produce,
// broker, fetch, or a lane free but not yet handed out). Their own
// batch's phases follow, and those of the batch they waited behind last.
func (c *commitClock) tail() TailProfile {
	if len(c.samples) == 0 {
		return TailProfile{}
	}
	ss := slices.Clone(c.samples)
	slices.SortFunc(ss, func(a, b sample) int { return cmp.Compare(a.b.commit.Sub(a.sent), b.b.commit.Sub(b.sent)) })
	top := ss[len(ss)*99/100:]
	var t TailProfile
	t.N = len(top)
	for _, s := range top {
		t.Latency += s.b.commit.Sub(s.sent)
		t.ToStart += s.b.start.Sub(s.sent)
		t.InBatch += s.b.commit.Sub(s.b.start)
		t.Claim += s.b.claim
		t.Handle += s.b.handle
		t.Commit += s.b.commit_
		t.Size += s.b.size
		var prev *batchTimes
		for _, o := range c.lanes[s.b.lane] {
			if o == s.b {
				break
			}
			lo, hi := o.start, o.end
			if s.sent.After(lo) {
				lo = s.sent
			}
			if s.b.start.Before(hi) {
				hi = s.b.start
			}
			if hi.After(lo) {
				t.Busy += hi.Sub(lo)
			}
			prev = o
		}
		if prev != nil {
			t.PrevTotal += prev.end.Sub(prev.start)
			t.PrevCommit += prev.commit_
			t.PrevSize += prev.size
			t.Gap += max(0, s.b.start.Sub(prev.end))
		}
	}
	n := time.Duration(t.N)
	t.Latency, t.ToStart, t.InBatch, t.Busy = t.Latency/n, t.ToStart/n, t.InBatch/n, t.Busy/n
	t.Claim, t.Handle, t.Commit = t.Claim/n, t.Handle/n, t.Commit/n
	t.PrevTotal, t.PrevCommit, t.Gap = t.PrevTotal/n, t.PrevCommit/n, t.Gap/n
	t.Size /= t.N
	t.PrevSize /= t.N
	return t
}

// TailProfile is the mean timing of the slowest 1% of a run's messages
// (see commitClock.tail).
type TailProfile struct {
	N                               int
	Latency, ToStart, Busy, InBatch time.Duration
	Claim, Handle, Commit           time.Duration
	Size, PrevSize                  int
	PrevTotal, PrevCommit, Gap      time.Duration
}

func (t TailProfile) String() string {
	return fmt.Sprintf("tail (slowest %d): latency %s = to start %s (lane busy %s) + in batch %s (claim %s, handle %s, commit %s; size %d); batch before: %s (commit %s; size %d), gap after it %s",
		t.N, latMS(t.Latency), latMS(t.ToStart), latMS(t.Busy), latMS(t.InBatch), latMS(t.Claim), latMS(t.Handle), latMS(t.Commit), t.Size,
		latMS(t.PrevTotal), latMS(t.PrevCommit), t.PrevSize, latMS(t.Gap))
}

// percentile sorts d and returns its p-th percentile (0 when d is empty).
func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, len(d)*p/100)]
}
