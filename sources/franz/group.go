package franz

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Claim retries: a partition whose offsets row is locked by a transaction
// in progress is claimed again after claimRetryMin, doubling up to
// claimRetryMax, until that transaction ended.
const (
	claimRetryMin = 50 * time.Millisecond
	claimRetryMax = time.Second
)

// kafkaOpTimeout bounds one offset commit to the group coordinator.
const kafkaOpTimeout = 10 * time.Second

// kafkaCommit is what Kafka holds for one partition of the group.
type kafkaCommit struct {
	offset int64 // -1 for none
	origin int64 // -1 unless the commit carries the origin marker
}

// start makes the client, which joins the group, once.
func (s *Source) start() error {
	s.startOnce.Do(func() {
		cl, err := kgo.NewClient(s.opts...)
		if err != nil {
			s.startErr = consumer.Permanent(fmt.Errorf("franz: %w", err))
			return
		}
		s.runCtx, s.cancel = context.WithCancel(context.Background())
		s.mu.Lock()
		s.cl = cl
		s.mu.Unlock()
		s.done.Add(2)
		go func() {
			defer s.done.Done()
			s.pollLoop(s.runCtx, cl)
		}()
		go func() {
			defer s.done.Done()
			s.commitLoop(s.runCtx, cl)
		}()
	})
	return s.startErr
}

// onOffsetsFetched keeps what Kafka holds for the partitions being
// assigned, with the metadata kgo's offsets leave out (the origin, see
// kafka.OriginMetadata), for adjustOffsets.
func (s *Source) onOffsetsFetched(_ context.Context, cl *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
	commits := map[TopicPartition]kafkaCommit{}
	add := func(topic string, p int32, off int64, meta *string) {
		c := kafkaCommit{offset: -1, origin: -1}
		if off >= 0 {
			c.offset = off
			if meta != nil {
				c.origin = kafka.ParseOrigin(*meta)
			}
		}
		commits[TopicPartition{Topic: topic, Partition: int(p)}] = c
	}
	for _, g := range resp.Groups {
		for _, t := range g.Topics {
			for _, p := range t.Partitions {
				add(t.Topic, p.Partition, p.Offset, p.Metadata)
			}
		}
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			add(t.Topic, p.Partition, p.Offset, p.Metadata)
		}
	}
	s.mu.Lock()
	s.commits = commits
	s.gcl = cl
	s.mu.Unlock()
	return nil
}

// adjustOffsets runs when the group assigned partitions to this member,
// before they are fetched: it claims them in Postgres for the member's
// generation and starts each from its stored offset (see startOffset).
// Partitions whose offsets row another transaction holds locked are
// paused and claimed again until that transaction ended; partitions a
// newer generation owns in Postgres are paused for this session.
func (s *Source) adjustOffsets(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	s.mu.Lock()
	cl, commits := s.gcl, s.commits
	s.session = ctx
	s.mu.Unlock()
	_, gen := cl.GroupMetadata()
	var tps []TopicPartition
	for topic, parts := range offsets {
		for p := range parts {
			tps = append(tps, TopicPartition{Topic: topic, Partition: int(p)})
		}
	}
	sortPartitions(tps)
	s.log.Info("franz: generation started", "group", s.cfg.Group, "generation", gen, "partitions", len(tps))
	if len(tps) == 0 {
		return offsets, nil
	}
	var claimed map[TopicPartition]kafka.StoredPosition
	var busy []TopicPartition
	if s.store != nil {
		var err error
		claimed, busy, err = s.store.Claim(ctx, gen, tps)
		switch {
		case errors.Is(err, kafka.ErrClaimBusy):
			busy = tps
		case err != nil:
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			s.log.Error("franz: claiming partitions; consuming them once a claim succeeds", "group", s.cfg.Group, "generation", gen, "err", err)
			busy = tps
		}
	} else {
		claimed = make(map[TopicPartition]kafka.StoredPosition, len(tps))
		for _, tp := range tps {
			claimed[tp] = kafka.NoStoredPosition
		}
	}
	var started, paused []TopicPartition
	for _, tp := range tps {
		next, ok := claimed[tp]
		if !ok {
			paused = append(paused, tp)
			if !slices.Contains(busy, tp) {
				s.log.Error("franz: partition is owned by a newer generation in Postgres; not consuming it in this generation "+
					"(if the group was deleted and recreated, delete its rows from the offsets table)",
					"group", s.cfg.Group, "lane", tp.String(), "generation", gen)
			}
			continue
		}
		kafkaStart := offsets[tp.Topic][int32(tp.Partition)].EpochOffset().Offset
		start := s.openLane(ctx, tp, gen, next, kafkaStart, commitOf(commits, tp))
		if start >= 0 {
			offsets[tp.Topic][int32(tp.Partition)] = kgo.NewOffset().At(start).WithEpoch(-1)
		}
		started = append(started, tp)
	}
	cl.ResumeFetchPartitions(partitionMap(started)) // pauses persist across assignments
	if len(paused) > 0 {
		cl.PauseFetchPartitions(partitionMap(paused))
	}
	if len(started) > 0 {
		s.log.Info("franz: partitions claimed", "group", s.cfg.Group, "generation", gen, "lanes", laneNames(started))
	}
	if len(busy) > 0 {
		go s.claimLater(ctx, cl, gen, busy, commits)
	}
	return offsets, nil
}

// openLane opens tp's lane for generation gen, unless ctx (the session)
// ended, and returns the offset to consume it from (-1: where kgo
// starts it, kafkaStart, the offset in Kafka or the reset offset).
func (s *Source) openLane(ctx context.Context, tp TopicPartition, gen int32, stored kafka.StoredPosition, kafkaStart int64, c kafkaCommit) int64 {
	start, origin := s.startOffset(tp, gen, stored.Next, kafkaStart, c)
	l := newLane(tp, gen)
	if start >= 0 {
		l.startAt(start)
	}
	l.origin = origin
	if s.store != nil {
		l.persisted, l.persistedHigh = stored.Next, stored.High
	}
	if c.offset >= 0 {
		l.kafkaCommitted = c.offset
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ctx.Err() != nil || s.closed {
		return start
	}
	s.forgetCounts(tp, start)
	s.lanes[tp] = l
	s.sched.Open(l.name, l)
	return start
}

// startOffset returns the offset to consume tp from and its origin: the
// next offset stored in Postgres; else, when Kafka holds an offset this
// source committed after storing it in Postgres, which the database no
// longer has, the partition's origin (the database lost its last
// commits); else the offset in Kafka; else -1, the reset offset (the
// origin is then the first record's).
func (s *Source) startOffset(tp TopicPartition, gen int32, stored, kafkaStart int64, c kafkaCommit) (start, origin int64) {
	if stored >= 0 {
		if c.origin >= 0 {
			return stored, min(c.origin, stored)
		}
		return stored, stored
	}
	if s.store != nil && c.origin >= 0 {
		s.log.Warn("franz: the offsets table holds no offset for a partition although this group stored one there before committing "+
			"offset kafka_offset to Kafka: the database lost its last commits (an asynchronous failover, a restore from backup), and the "+
			"partition's effects and markers with them; consuming it again from origin, where the group first consumed it "+
			"(if the consumer was pointed at another database on purpose, see docs/failover.md)",
			"group", s.cfg.Group, "lane", tp.String(), "generation", gen, "kafka_offset", c.offset, "origin", c.origin)
		return c.origin, c.origin
	}
	if kafkaStart >= 0 {
		return kafkaStart, kafkaStart
	}
	return -1, -1
}

// claimLater claims the partitions whose offsets rows were locked (or
// whose claim failed) until all are claimed or the session ended, and
// starts each, paused until then, from the offset it claimed.
func (s *Source) claimLater(ctx context.Context, cl *kgo.Client, gen int32, pending []TopicPartition, commits map[TopicPartition]kafkaCommit) {
	wait := claimRetryMin
	waitingSince, warned := time.Now(), time.Time{}
	for len(pending) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(wait*2, claimRetryMax)
		claimed, busy, err := s.store.Claim(ctx, gen, pending)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, kafka.ErrClaimBusy):
			busy = pending
		case err != nil:
			s.log.Error("franz: claiming partitions", "group", s.cfg.Group, "generation", gen, "err", err)
			continue
		}
		var got []TopicPartition
		seek := map[string]map[int32]kgo.EpochOffset{}
		for _, tp := range pending {
			next, ok := claimed[tp]
			if !ok {
				if !slices.Contains(busy, tp) {
					s.log.Error("franz: partition is owned by a newer generation in Postgres; not consuming it in this generation",
						"group", s.cfg.Group, "lane", tp.String(), "generation", gen)
				}
				continue
			}
			// The partition was paused from its assignment on: kgo's
			// position is still the one adjustOffsets left, the offset in
			// Kafka or the reset offset.
			c := commitOf(commits, tp)
			if start := s.openLane(ctx, tp, gen, next, c.offset, c); start >= 0 {
				if seek[tp.Topic] == nil {
					seek[tp.Topic] = map[int32]kgo.EpochOffset{}
				}
				seek[tp.Topic][int32(tp.Partition)] = kgo.EpochOffset{Epoch: -1, Offset: start}
			}
			got = append(got, tp)
		}
		if len(got) > 0 {
			cl.SetOffsets(seek)
			cl.ResumeFetchPartitions(partitionMap(got))
			s.log.Info("franz: locked partitions claimed", "group", s.cfg.Group, "generation", gen,
				"lanes", laneNames(got), "waited", time.Since(waitingSince).Round(time.Millisecond))
		}
		pending = busy
		if len(pending) > 0 && time.Since(warned) >= time.Minute {
			warned = time.Now()
			s.log.Warn("franz: offsets rows locked by a transaction of an earlier owner; consuming the other partitions, and these once it ends",
				"group", s.cfg.Group, "generation", gen, "lanes", laneNames(pending), "waited", time.Since(waitingSince).Round(time.Millisecond))
		}
	}
}

// onRevoked drops the revoked partitions' lanes once their in-flight
// batches committed (for up to RevokeTimeout; at once when the source is
// closing), and commits their offsets to Kafka, before the member rejoins.
func (s *Source) onRevoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	lanes := s.revoke(revoked, true)
	s.commitKafka(cl, lanes)
	cl.ResumeFetchPartitions(revoked)
}

// onLost drops the lost partitions' lanes at once: the member is out of
// the group (its session expired, a fatal group error), another member
// may own them already, and the Postgres fence refuses its batches.
func (s *Source) onLost(ctx context.Context, cl *kgo.Client, lost map[string][]int32) {
	s.revoke(lost, false)
	cl.ResumeFetchPartitions(lost)
}

// revoke stops handing out the lanes of tps, with wait lets their
// in-flight batches finish for up to RevokeTimeout (not when the source is
// closing), then drops them: a batch still in flight is refused at
// BeforeCommit and ignored at Settle. It returns the dropped lanes.
func (s *Source) revoke(tps map[string][]int32, wait bool) []*lane {
	s.mu.Lock()
	var lanes []*lane
	for topic, parts := range tps {
		for _, p := range parts {
			if l := s.lanes[TopicPartition{Topic: topic, Partition: int(p)}]; l != nil {
				l.state = laneRevoking
				s.sched.Stop(l.name)
				lanes = append(lanes, l)
			}
		}
	}
	timer := time.NewTimer(s.cfg.RevokeTimeout)
	defer timer.Stop()
	for wait {
		changed := s.sched.Changed()
		if s.closed || !s.inFlight(lanes) {
			break
		}
		s.mu.Unlock()
		timedOut := false
		select {
		case <-changed:
		case <-timer.C:
			timedOut = true
		}
		s.mu.Lock()
		if timedOut {
			break
		}
	}
	abandoned := 0
	for _, l := range lanes {
		inFlight, retries := s.sched.Remove(l.name)
		s.rememberCounts(l, inFlight, retries)
		l.state = laneRevoked
		if inFlight != nil {
			abandoned++
		}
		if s.lanes[l.tp] == l {
			delete(s.lanes, l.tp)
		}
	}
	s.mu.Unlock()
	if abandoned > 0 && wait {
		s.log.Warn("franz: batches abandoned at revoke", "group", s.cfg.Group, "batches", abandoned)
	}
	return lanes
}

// inFlight reports whether one of lanes has a batch in flight.
func (s *Source) inFlight(lanes []*lane) bool {
	for _, l := range lanes {
		if s.sched.Lane(l.name).InFlight != nil {
			return true
		}
	}
	return false
}

// commitOf returns what Kafka holds for tp in commits, none when absent.
func commitOf(commits map[TopicPartition]kafkaCommit, tp TopicPartition) kafkaCommit {
	if c, ok := commits[tp]; ok {
		return c
	}
	return kafkaCommit{offset: -1, origin: -1}
}

func partitionMap(tps []TopicPartition) map[string][]int32 {
	m := make(map[string][]int32, len(tps))
	for _, tp := range tps {
		m[tp.Topic] = append(m[tp.Topic], int32(tp.Partition))
	}
	return m
}

func laneNames(tps []TopicPartition) []string {
	out := make([]string, len(tps))
	for i, tp := range tps {
		out[i] = tp.String()
	}
	return out
}

func sortPartitions(tps []TopicPartition) {
	slices.SortFunc(tps, func(a, b TopicPartition) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return a.Partition - b.Partition
	})
}
