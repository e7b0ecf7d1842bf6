package chaostest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// stall is a time during which a partition (or, for the whole group, every
// partition) had messages waiting and its stored offset did not move.
type stall struct {
	lane       string // "" for the whole group
	start, end time.Time
	open       bool // still stalled when the run ended
	// first is true when the partition had never been consumed from
	// before: the wait for a new partition to be picked up.
	first bool
}

func (s stall) d() time.Duration { return s.end.Sub(s.start) }

// laneState is what the sampler knows of one partition.
type laneState struct {
	next      int64 // stored next offset, 0 when none is stored yet
	gen       int32
	since     time.Time // last time it moved or had nothing waiting
	moved     bool      // the stored offset moved at least once
	firstMove time.Time
	waits     bool // had messages waiting at the last sample
}

// sampler reads the offsets table every interval. It checks that stored
// offsets and generations never go backwards and measures stalls: per
// partition, and for the group as a whole (no partition moved while some
// had messages waiting).
type sampler struct {
	pool  *pgxpool.Pool
	group string
	prod  *producer
	every time.Duration
	// minStall is the shortest stall recorded (shorter ones are normal
	// processing).
	minStall time.Duration

	mu         sync.Mutex
	lanes      map[laneKey]*laneState
	groupSince time.Time
	groupWaits bool
	stalls     []stall
	violations []string
	samples    int
	lastMove   time.Time // last time any partition moved
	maxGen     int32     // highest generation stored
	genChanged time.Time // when maxGen last rose
	queryErrs  int
}

func newSampler(pool *pgxpool.Pool, group string, prod *producer) *sampler {
	now := time.Now()
	return &sampler{pool: pool, group: group, prod: prod, every: 100 * time.Millisecond, minStall: 500 * time.Millisecond,
		lanes: map[laneKey]*laneState{}, groupSince: now, lastMove: now}
}

func (s *sampler) run(ctx context.Context) {
	t := time.NewTicker(s.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.sample(ctx)
	}
}

// sample takes one sample: the log ends first, then the stored offsets, so
// that a partition whose offset reached the end it had then is caught up.
func (s *sampler) sample(ctx context.Context) {
	ends := s.prod.endsSnapshot()
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := s.pool.Query(qctx, `SELECT topic, partition, coalesce(next_offset, 0), generation FROM effectively.kafka_offsets WHERE group_id = $1`, s.group)
	var stored map[laneKey][2]int64
	if err == nil {
		stored = map[laneKey][2]int64{}
		var (
			k    laneKey
			next int64
			gen  int32
		)
		_, err = pgx.ForEachRow(rows, []any{&k.topic, &k.partition, &next, &gen}, func() error {
			stored[k] = [2]int64{next, int64(gen)}
			return nil
		})
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			s.queryErrs++
		}
		return
	}
	s.samples++
	anyMoved, anyWaits := false, false
	for k := range ends {
		if _, ok := stored[k]; !ok {
			stored[k] = [2]int64{0, -1}
		}
	}
	for k, v := range stored {
		next, gen := v[0], int32(v[1])
		st := s.lanes[k]
		if st == nil {
			st = &laneState{gen: -1, since: now}
			s.lanes[k] = st
		}
		if next < st.next {
			s.violations = append(s.violations, fmt.Sprintf("%s: stored offset went back from %d to %d at %s", k, st.next, next, now.Format(time.TimeOnly+".000")))
		}
		if gen >= 0 && gen < st.gen {
			s.violations = append(s.violations, fmt.Sprintf("%s: stored generation went back from %d to %d at %s", k, st.gen, gen, now.Format(time.TimeOnly+".000")))
		}
		moved := next > st.next
		waits := ends[k] > next
		if moved || !waits {
			if st.waits && now.Sub(st.since) >= s.minStall {
				s.stalls = append(s.stalls, stall{lane: k.String(), start: st.since, end: now, first: !st.moved})
			}
			st.since = now
		}
		if moved {
			anyMoved = true
			if !st.moved {
				st.moved, st.firstMove = true, now
			}
			s.lastMove = now
		}
		if waits {
			anyWaits = true
		}
		st.next, st.gen, st.waits = max(st.next, next), max(st.gen, gen), waits
		if gen > s.maxGen {
			s.maxGen, s.genChanged = gen, now
		}
	}
	if anyMoved || !anyWaits {
		if s.groupWaits && now.Sub(s.groupSince) >= s.minStall {
			s.stalls = append(s.stalls, stall{start: s.groupSince, end: now})
		}
		s.groupSince = now
	}
	s.groupWaits = anyWaits
}

// finish closes the stalls still open at the end of the run.
func (s *sampler) finish() {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, st := range s.lanes {
		if st.waits {
			s.stalls = append(s.stalls, stall{lane: k.String(), start: st.since, end: now, open: true, first: !st.moved})
		}
	}
	if s.groupWaits {
		s.stalls = append(s.stalls, stall{start: s.groupSince, end: now, open: true})
	}
}

// current returns the longest stall in progress among the partitions that
// moved at least once (partitions never consumed are the topology checks'
// business), and the time since any partition last moved.
func (s *sampler) current() (longest time.Duration, lane string, sinceMove time.Duration) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, st := range s.lanes {
		if st.waits && st.moved {
			if d := now.Sub(st.since); d > longest {
				longest, lane = d, k.String()
			}
		}
	}
	return longest, lane, now.Sub(s.lastMove)
}

// generationChanged returns when a new generation last claimed
// partitions in the offsets table (zero if none did yet).
func (s *sampler) generationChanged() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.genChanged
}

// positions returns the stored next offset of every partition seen.
func (s *sampler) positions() map[laneKey]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[laneKey]int64, len(s.lanes))
	for k, st := range s.lanes {
		out[k] = st.next
	}
	return out
}

// firstMoves returns when each partition's stored offset first moved.
func (s *sampler) firstMoves() map[laneKey]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[laneKey]time.Time, len(s.lanes))
	for k, st := range s.lanes {
		if st.moved {
			out[k] = st.firstMove
		}
	}
	return out
}

// stalls returns the recorded stalls: the group's with group, else the
// partitions' that were not waits for a first pickup.
func (s *sampler) stallList(group bool) []stall {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []stall
	for _, st := range s.stalls {
		if (st.lane == "") == group && !st.first {
			out = append(out, st)
		}
	}
	return out
}

// count returns the number of samples taken.
func (s *sampler) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}
