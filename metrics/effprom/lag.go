package effprom

import (
	"context"
	"time"
)

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

// ReportLag keeps consumerName's lag series up to date from lag, such as a
// Kafka source's Lag method: it reads lag at once and then every interval
// (at least 100ms) until ctx is done, sets each lane's gauge, and removes
// the series of lanes lag no longer reports (partitions now read
// elsewhere). Run it in its own goroutine.
func (m *Metrics) ReportLag(ctx context.Context, consumerName string, every time.Duration, lag func() map[string]int64) {
	every = max(every, 100*time.Millisecond)
	tick := time.NewTicker(every)
	defer tick.Stop()
	seen := map[string]bool{}
	for {
		now := lag()
		for lane, v := range now {
			m.SetLag(consumerName, lane, float64(v))
			seen[lane] = true
		}
		for lane := range seen {
			if _, ok := now[lane]; !ok {
				m.DeleteLag(consumerName, lane)
				delete(seen, lane)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
