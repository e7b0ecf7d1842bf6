package franz

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// refreshEnds asks the brokers for the end of the logs of the active
// lanes whose end no fetch told yet (a partition with no records after
// its position returns none), so that Lag reports them.
func (s *Source) refreshEnds(ctx context.Context, cl *kgo.Client) {
	s.mu.Lock()
	var unknown []TopicPartition
	for tp, l := range s.lanes {
		if l.state == laneActive && !l.fenced && l.highWatermark < 0 {
			unknown = append(unknown, tp)
		}
	}
	s.mu.Unlock()
	if len(unknown) == 0 {
		return
	}
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	if !s.cfg.ReadUncommitted {
		req.IsolationLevel = 1 // the last stable offset: what a read-committed fetch reaches
	}
	for topic, parts := range partitionMap(unknown) {
		t := kmsg.NewListOffsetsRequestTopic()
		t.Topic = topic
		for _, p := range parts {
			rp := kmsg.NewListOffsetsRequestTopicPartition()
			rp.Partition = p
			rp.Timestamp = -1 // the end
			t.Partitions = append(t.Partitions, rp)
		}
		req.Topics = append(req.Topics, t)
	}
	ctx, cancel := context.WithTimeout(ctx, kafkaOpTimeout)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		s.log.Debug("franz: reading the end of the partitions", "group", s.cfg.Group, "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			l := s.lanes[TopicPartition{Topic: t.Topic, Partition: int(p.Partition)}]
			if p.ErrorCode == 0 && l != nil && l.highWatermark < 0 {
				l.highWatermark = p.Offset
			}
		}
	}
}
