package kafka

// TopicPartition names one partition of a topic, for the rebalance hooks
// (Config.OnAssigned, Config.OnRevoked).
type TopicPartition struct {
	Topic     string
	Partition int
}

// String returns "topic/partition", the partition's lane name.
func (tp TopicPartition) String() string { return laneName(tp.Topic, tp.Partition) }
