package effprom

import (
	"context"
	"time"

	"github.com/effectively-once/effectively/outbox"
	prom "github.com/prometheus/client_golang/prometheus"
)

const labelSlot = "slot"

// slotMetrics are the log relay's series, by slot.
type slotMetrics struct {
	lag, oldest, reported     *prom.GaugeVec
	reconnects, lost, created *prom.CounterVec
	recovered                 *prom.CounterVec
}

func newSlotMetrics(ns string, cl prom.Labels) slotMetrics {
	gauge := func(name, help string) *prom.GaugeVec {
		return prom.NewGaugeVec(prom.GaugeOpts{Namespace: ns, Name: name, Help: help, ConstLabels: cl}, []string{labelSlot})
	}
	counter := func(name, help string) *prom.CounterVec {
		return prom.NewCounterVec(prom.CounterOpts{Namespace: ns, Name: name, Help: help, ConstLabels: cl}, []string{labelSlot})
	}
	return slotMetrics{
		lag: gauge("outbox_slot_lag_bytes",
			"Bytes of WAL a log relay's slot is behind the server (its confirmed position against the current one), as last reported by the relay reading it."),
		oldest: gauge("outbox_slot_oldest_unconfirmed_seconds",
			"Age of the oldest commit the log relay received and has not confirmed (not all its messages published yet), as last reported; 0 when none waits."),
		reported: gauge("outbox_slot_reported_timestamp_seconds",
			"When a log relay reading the slot last reported (Unix time): a stale value means no relay reads the slot, so its lag series are stale too."),
		reconnects: counter("outbox_slot_reconnects_total",
			"Replication streams a log relay lost and opened again (it resumes from the slot's confirmed position, publishing again, with the same IDs, what followed it)."),
		lost: counter("outbox_slot_losses_total",
			"Slots a log relay found dropped or invalidated and created again, publishing from the table every message not yet confirmed."),
		created: counter("outbox_slot_creations_total",
			"Slots a log relay created (a first start, or after a loss)."),
		recovered: counter("outbox_slot_recovered_messages_total",
			"Messages a log relay published from the outbox table when it created a slot: what the new slot could not deliver (after a loss, duplicates with the same IDs)."),
	}
}

func (s slotMetrics) collectors() []prom.Collector {
	return []prom.Collector{s.lag, s.oldest, s.reported, s.reconnects, s.lost, s.created, s.recovered}
}

// SlotLag implements outbox.LogHook: it sets the slot's gauges and adds to
// its counters what the relay counted since its last report. Only the
// relay reading the slot reports; a relay's events while it stood by
// show at its first report once it reads.
func (m *RelayMetrics) SlotLag(_ context.Context, s outbox.LogStats, lagBytes int64) {
	m.slot.lag.WithLabelValues(s.Slot).Set(float64(lagBytes))
	m.slot.oldest.WithLabelValues(s.Slot).Set(s.OldestUnconfirmed.Seconds())
	m.slot.reported.WithLabelValues(s.Slot).Set(float64(time.Now().UnixNano()) / 1e9)
	m.mu.Lock()
	prev := m.last[s.Owner]
	m.last[s.Owner] = s
	m.mu.Unlock()
	add := func(v *prom.CounterVec, now, before int64) {
		c := v.WithLabelValues(s.Slot) // every series exists from the first report
		if now > before {
			c.Add(float64(now - before))
		}
	}
	add(m.slot.reconnects, int64(s.Reconnects), int64(prev.Reconnects))
	add(m.slot.lost, int64(s.SlotsLost), int64(prev.SlotsLost))
	add(m.slot.created, int64(s.SlotsCreated), int64(prev.SlotsCreated))
	add(m.slot.recovered, s.Recovered, prev.Recovered)
}
