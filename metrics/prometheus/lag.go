package prometheus

// SetLag reports how many messages the consumer named consumerName is
// behind its source on lane (a Kafka partition such as "orders/3", an SQS
// queue): the lag_messages gauge. Call it whenever the lag is known, from
// the source's metadata or a periodic check; the gauge keeps the last
// value. Use it for lanes whose number is bounded: every lane is a series.
func (m *Metrics) SetLag(consumerName, lane string, lag float64) {
	m.lag.WithLabelValues(consumerName, lane).Set(lag)
}

// DeleteLag removes the lag series of a lane this process no longer reads
// (a partition assigned elsewhere after a rebalance). It reports whether
// the series existed.
func (m *Metrics) DeleteLag(consumerName, lane string) bool {
	return m.lag.DeleteLabelValues(consumerName, lane)
}
