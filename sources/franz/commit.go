package franz

import (
	"context"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/internal/logx"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// fenced reports a lane whose offsets write was refused. When the table
// went back, the partition is claimed again, and consumed again from the
// offset stored.
func (s *Source) fenced(l *lane, err error) {
	known, found, back := kafka.WentBack(err)
	if !back {
		s.log.Warn("franz: partition fenced by a newer generation; not consuming it until the group takes it from this member",
			"group", s.cfg.Group, "lane", l.name, "generation", l.gen)
		s.mu.Lock()
		cl := s.gcl
		s.mu.Unlock()
		if cl != nil {
			cl.PauseFetchPartitions(partitionMap([]TopicPartition{l.tp})) // resumed when it is revoked
		}
		return
	}
	s.wentBack(l, known, found)
}

// wentBack claims l's partition again, to consume it from the offset
// stored, after the offsets table was found to hold found, less than the
// known l stored: the database lost commits, or a replay moved it back.
func (s *Source) wentBack(l *lane, known, found kafka.StoredPosition) {
	s.log.Error("franz: the offsets table went back; claiming the partition again to consume it from the stored offset",
		"group", s.cfg.Group, "lane", l.name, "generation", l.gen, "stored", found.Next, "known", known.Next,
		"stored_high", found.High, "known_high", known.High)
	s.mu.Lock()
	cl, ctx := s.gcl, s.session
	if s.lanes[l.tp] == l {
		delete(s.lanes, l.tp)
		inFlight, retries := s.sched.Remove(l.name)
		s.rememberCounts(l, inFlight, retries)
	}
	l.state = laneRevoked
	s.mu.Unlock()
	if cl == nil || ctx == nil {
		return
	}
	cl.PauseFetchPartitions(partitionMap([]TopicPartition{l.tp}))
	_, gen := cl.GroupMetadata()
	// When the row is gone altogether, the partition starts again from its
	// origin, where this group first consumed it with its offsets here.
	s.mu.Lock()
	c := kafkaCommit{offset: l.kafkaCommitted, origin: l.origin}
	s.mu.Unlock()
	go s.claimLater(ctx, cl, max(gen, l.gen), []TopicPartition{l.tp}, map[TopicPartition]kafkaCommit{l.tp: c})
}

// commitLoop commits the settled offsets of the active lanes to Kafka
// every second, and when a batch moved a commit point, until ctx is done.
func (s *Source) commitLoop(ctx context.Context, cl *kgo.Client) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.commit:
		case <-tick.C:
		}
		s.mu.Lock()
		lanes := make([]*lane, 0, len(s.lanes))
		for _, l := range s.lanes {
			if l.state == laneActive && !l.fenced {
				lanes = append(lanes, l)
			}
		}
		s.mu.Unlock()
		s.commitKafka(cl, lanes)
		s.refreshEnds(ctx, cl)
		s.verifyStored(ctx, lanes)
	}
}

// commitKafka commits the settled offsets of lanes to Kafka, with each
// partition's origin as metadata, for tooling and lag monitoring (and as
// the position itself with KafkaOffsetsOnly). It never commits past what
// committed in Postgres.
func (s *Source) commitKafka(cl *kgo.Client, lanes []*lane) {
	offsets := map[string]map[int32]kgo.EpochOffset{}
	meta := map[TopicPartition]string{}
	s.mu.Lock()
	for _, l := range lanes {
		point := l.committed
		if s.store != nil {
			point = min(point, l.persisted)
			meta[l.tp] = kafka.OriginMetadata(min(l.origin, point))
		}
		if point >= 0 && point > l.kafkaCommitted {
			if offsets[l.topic] == nil {
				offsets[l.topic] = map[int32]kgo.EpochOffset{}
			}
			offsets[l.topic][int32(l.partition)] = kgo.EpochOffset{Epoch: -1, Offset: point}
		}
	}
	s.mu.Unlock()
	if len(offsets) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), kafkaOpTimeout)
	defer cancel()
	ctx = kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		for i := range req.Topics {
			t := &req.Topics[i]
			for j := range t.Partitions {
				if m, ok := meta[TopicPartition{Topic: t.Topic, Partition: int(t.Partitions[j].Partition)}]; ok {
					t.Partitions[j].Metadata = &m
				}
			}
		}
		return nil
	})
	var cerr error
	cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			cerr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if perr := kerr.ErrorForCode(p.ErrorCode); perr != nil {
					cerr = fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, perr)
				}
			}
		}
	})
	if cerr != nil {
		s.kafkaCommits.Failed(s.log, logx.KafkaCommitFailed("franz", s.store == nil), cerr, "group", s.cfg.Group)
		return
	}
	s.kafkaCommits.Succeeded()
	s.mu.Lock()
	for _, l := range lanes {
		if eo, ok := offsets[l.topic][int32(l.partition)]; ok && eo.Offset > l.kafkaCommitted {
			l.kafkaCommitted = eo.Offset
		}
	}
	s.mu.Unlock()
}

// verifyStored claims again the partitions of lanes whose offsets row holds
// less than the lane knows it stored: the database lost commits (an
// asynchronous failover) or a replay moved the offsets back. A lane's next
// offset write finds that out too, but a lane with nothing more to consume
// writes nothing, and its lost commits would wait for its next record;
// this check, once a second, finds them within a second. What the lanes
// know is read before the table, so a batch committing meanwhile can only
// make the table hold more.
func (s *Source) verifyStored(ctx context.Context, lanes []*lane) {
	if s.store == nil {
		return
	}
	type check struct {
		l     *lane
		known kafka.StoredPosition
	}
	var checks []check
	var tps []TopicPartition
	s.mu.Lock()
	for _, l := range lanes {
		if k := l.known(); l.state == laneActive && !l.fenced && (k.Next >= 0 || k.High >= 0) {
			checks = append(checks, check{l, k})
			tps = append(tps, l.tp)
		}
	}
	s.mu.Unlock()
	if len(checks) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stored, err := s.store.Positions(rctx, tps)
	if err != nil {
		s.log.Debug("franz: reading the stored offsets to compare them with the lanes'", "group", s.cfg.Group, "err", err)
		return
	}
	for _, c := range checks {
		found, ok := stored[c.l.tp]
		if !ok {
			found = kafka.NoStoredPosition
		}
		if !kafka.Behind(found, c.known) {
			continue
		}
		s.mu.Lock()
		still := s.lanes[c.l.tp] == c.l && c.l.state == laneActive && !c.l.fenced
		if still {
			c.l.fenced = true
			s.sched.Stop(c.l.name)
		}
		s.mu.Unlock()
		if still {
			s.wentBack(c.l, c.known, found)
		}
	}
}
