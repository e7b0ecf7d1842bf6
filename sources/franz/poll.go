package franz

import (
	"context"
	"errors"
	"fmt"

	"github.com/effectively-once/effectively/consumer"
	"github.com/twmb/franz-go/pkg/kgo"
)

// pollLoop moves what the client fetched into the lanes until ctx is done
// or the client is closed. A partition holding PartitionBuffer undelivered
// records is paused until Fetch took half of them. The client's errors are
// logged, and Fetch returns them while no partition is assigned.
func (s *Source) pollLoop(ctx context.Context, cl *kgo.Client) {
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil || fs.IsClientClosed() {
			return
		}
		var failed error
		fs.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			where := "client"
			if topic != "" {
				where = fmt.Sprintf("%s/%d", topic, p)
			}
			if s.instanceFenced(cl, err) {
				return
			}
			s.log.Warn("franz: fetch", "group", s.cfg.Group, "at", where, "err", err)
			failed = err
		})
		s.setError(failed)
		var full []*lane
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if l := s.buffer(p); l != nil {
				full = append(full, l)
			}
		})
		for _, l := range full {
			s.syncPause(cl, l)
		}
	}
}

// setError records the client's last failure for Fetch to return while no
// partition is assigned (nil clears it); a refused authentication is
// permanent.
func (s *Source) setError(err error) {
	if fe := s.fencedInstance.Load(); fe != nil {
		s.sched.SetError(*fe)
		return
	}
	if err != nil {
		err = fmt.Errorf("franz: consumer group %q: %w", s.cfg.Group, authFailure(err))
		if errors.Is(err, ErrAuthentication) {
			err = consumer.Permanent(err)
		}
	}
	s.sched.SetError(err)
}

// buffer hands the records of p to its lane, if the lane is active, and
// returns the lane when its buffer is now full: it is to be paused.
func (s *Source) buffer(p kgo.FetchTopicPartition) *lane {
	tp := TopicPartition{Topic: p.Topic, Partition: int(p.Partition)}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.lanes[tp]
	if l == nil || l.state != laneActive || l.fenced {
		return nil // not claimed (yet), or no longer owned: its next owner reads it
	}
	if p.HighWatermark >= 0 {
		l.highWatermark = p.HighWatermark
	}
	msgs := make([]*consumer.Message, 0, len(p.Records))
	for _, r := range p.Records {
		if l.next >= 0 && r.Offset < l.next {
			continue // fetched again after a seek
		}
		if l.next < 0 { // the lane started at the reset offset: here
			l.delivered, l.committed = r.Offset, r.Offset
			if l.origin < 0 {
				l.origin = r.Offset
			}
		}
		l.next = r.Offset + 1
		d := newDelivery(l, r, s.cfg.IDHeader)
		d.msg.Attempt = s.firstAttempt(l, r.Offset)
		msgs = append(msgs, &d.msg)
	}
	if len(msgs) == 0 || !s.sched.Add(l.name, msgs...) {
		return nil
	}
	if !l.paused && s.sched.Lane(l.name).Buffered >= s.cfg.PartitionBuffer {
		l.paused = true
		return l
	}
	return nil
}

// syncPause pauses or resumes l's partition in the client as l.paused
// says now. The poll loop pauses a full lane and Fetch resumes it, each
// after changing l.paused: pauseMu orders their calls, so a pause decided
// before a resume cannot reach the client after it and leave the
// partition paused for good. A lane no longer open is left alone: its
// revoke resumed it, and a new assignment resumes it again.
func (s *Source) syncPause(cl *kgo.Client, l *lane) {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	s.mu.Lock()
	open := s.lanes[l.tp] == l && l.state == laneActive
	paused := l.paused
	s.mu.Unlock()
	if !open {
		return
	}
	if paused {
		cl.PauseFetchPartitions(partitionMap([]TopicPartition{l.tp}))
	} else {
		cl.ResumeFetchPartitions(partitionMap([]TopicPartition{l.tp}))
	}
}
