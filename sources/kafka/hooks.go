package kafka

import "context"

// TopicPartition names one partition of a topic, for the rebalance hooks
// (Config.OnAssigned, Config.OnRevoked).
type TopicPartition struct {
	Topic     string
	Partition int
}

// String returns "topic/partition", the partition's lane name.
func (tp TopicPartition) String() string { return laneName(tp.Topic, tp.Partition) }

// assigned calls Config.OnAssigned with claimed, if it is set.
func (s *Source) assigned(ctx context.Context, claimed []topicPartition) {
	if s.cfg.OnAssigned == nil || len(claimed) == 0 {
		return
	}
	s.cfg.OnAssigned(ctx, exported(claimed))
}

// revoked calls Config.OnRevoked with the partitions of lanes, if it is set.
func (s *Source) revoked(lanes []*lane) {
	if s.cfg.OnRevoked == nil || len(lanes) == 0 {
		return
	}
	tps := make([]TopicPartition, len(lanes))
	for i, l := range lanes {
		tps[i] = TopicPartition{l.topic, l.partition}
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.RevokeTimeout)
	defer cancel()
	s.cfg.OnRevoked(ctx, tps)
}

func exported(tps []topicPartition) []TopicPartition {
	out := make([]TopicPartition, len(tps))
	for i, tp := range tps {
		out[i] = TopicPartition{tp.topic, tp.partition}
	}
	return out
}
