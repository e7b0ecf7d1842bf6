package chaostest

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// report renders what the run did and measured.
func (r *run) report(o outcome) string {
	p := r.prod
	logical, records, dups := p.status()
	poisonN := 0
	p.mu.Lock()
	for _, b := range p.poison {
		if b {
			poisonN++
		}
	}
	resent := p.failed
	p.mu.Unlock()
	kills, freezes := 0, 0
	for _, ev := range r.events {
		switch ev.kind {
		case "kill":
			kills++
		case "freeze":
			freezes++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "chaos report (seed %d)\n", r.pl.seed)
	fmt.Fprintf(&b, "  messages     %d logical (%d poison), %d records acknowledged: %d producer duplicates, %d resent after produce errors\n",
		logical, poisonN, records, dups, resent)
	fmt.Fprintf(&b, "  outcome      %d effect rows for %d distinct messages, %d parked rows\n", o.rows, len(o.effects), len(o.parked))
	fmt.Fprintf(&b, "  workers      %d at a time, %d started; %d kills, %d freezes of %s\n", r.pl.workers, len(r.workers), kills, freezes, freezeFor(timing))
	membership := "dynamic members"
	if r.static {
		membership = "an instance ID per worker slot, static members where the source has static membership"
	}
	fmt.Fprintf(&b, "  membership   %s\n", membership)
	fmt.Fprintf(&b, "  rebalances   %d generations (distinct \"generation started\" in the workers' logs)\n", r.generations())
	fmt.Fprintf(&b, "  group        SessionTimeout %s, HeartbeatInterval %s, RebalanceTimeout %s; stall bound %s, pickup bound %s\n",
		timing.session, timing.heartbeat, timing.rebalance, stallBound(timing), topologyBound(timing))
	fmt.Fprintf(&b, "  events (longest partition stall, longest group stall that began with the event):\n")
	var worst stall
	worstAt := ""
	for i, ev := range r.events {
		st, gs := r.stallAfter(i, false), r.stallAfter(i, true)
		fmt.Fprintf(&b, "    %7s %-15s %-30s %s  group %s\n", r.since(ev.at), ev.kind, ev.detail, stallString(st), stallString(gs))
		if st.d() > worst.d() {
			worst, worstAt = st, ev.kind+" "+ev.detail
		}
	}
	var worstGroup stall
	for _, s := range r.samp.stallList(true) {
		if s.d() > worstGroup.d() {
			worstGroup = s
		}
	}
	fmt.Fprintf(&b, "  longest stall  partition %s after %s; group %s\n", stallString(worst), worstAt, stallString(worstGroup))
	if r.pl.topology {
		moves := r.samp.firstMoves()
		var picks []string
		for _, l := range append(append([]laneKey{}, r.newLanes...), r.addLanes...) {
			at := r.newTopicAt
			if l.topic == topicA {
				at = r.addedAt
			}
			if m, ok := moves[l]; ok {
				picks = append(picks, fmt.Sprintf("%s %.1fs", l, m.Sub(at).Seconds()))
			} else {
				picks = append(picks, l.String()+" never")
			}
		}
		fmt.Fprintf(&b, "  pickup       first consumed after creation: %s\n", strings.Join(picks, ", "))
	}
	span := o.last.Sub(o.first)
	overall := 0.0
	if span > 0 {
		overall = float64(o.rows) / span.Seconds()
	}
	fmt.Fprintf(&b, "  throughput   overall %.0f msgs/s (%d effects over %s); best 5 s %.0f msgs/s\n",
		overall, o.rows, span.Round(100*time.Millisecond), best5s(o.perSecond))
	fmt.Fprintf(&b, "  offsets      %d samples, %d went backwards\n", r.samp.count(), len(r.samp.violations))
	fmt.Fprintf(&b, "  wall time    %s from the first worker's start to caught up", r.end.Sub(r.begin).Round(100*time.Millisecond))
	return b.String()
}

func stallString(s stall) string {
	if s.lane == "" && s.d() == 0 {
		return "-"
	}
	out := fmt.Sprintf("%.1fs", s.d().Seconds())
	if s.lane != "" {
		out += " (" + s.lane + ")"
	}
	if s.open {
		out += " still waiting at the end"
	}
	return out
}

// best5s returns the highest number of effects per second over 5
// consecutive seconds.
func best5s(perSecond map[int64]int) float64 {
	if len(perSecond) == 0 {
		return 0
	}
	lo, hi := int64(1<<62), int64(0)
	for s := range perSecond {
		lo, hi = min(lo, s), max(hi, s)
	}
	best, sum := 0, 0
	for s := lo; s <= hi; s++ {
		sum += perSecond[s]
		if s-5 >= lo {
			sum -= perSecond[s-5]
		}
		best = max(best, sum)
	}
	return float64(best) / 5
}

func sortedLanes[V any](m map[laneKey]V) []laneKey {
	out := make([]laneKey, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].topic != out[j].topic {
			return out[i].topic < out[j].topic
		}
		return out[i].partition < out[j].partition
	})
	return out
}

func countsString(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s: %d", k, m[k])
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func firstN(s []string, n int) string {
	if len(s) > n {
		return strings.Join(s[:n], ", ") + ", …"
	}
	return strings.Join(s, ", ")
}
