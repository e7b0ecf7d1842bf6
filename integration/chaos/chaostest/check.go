package chaostest

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/integration/chaos"
	"github.com/jackc/pgx/v5"
)

// outcome is what the database holds after a run.
type outcome struct {
	effects   map[string]int // msg_id → effect rows
	rows      int
	parked    map[string]int // dedupe_id → parked rows
	reasons   map[string]int
	parkCount int // sum of park_count
	perSecond map[int64]int
	first     time.Time
	last      time.Time
}

func (r *run) collect() outcome {
	t := r.t
	ctx := r.ctx
	o := outcome{effects: map[string]int{}, parked: map[string]int{}, reasons: map[string]int{}, perSecond: map[int64]int{}}
	query := func(what, sql string, dest []any, fn func(), args ...any) {
		rows, err := r.pool.Query(ctx, sql, args...)
		if err == nil {
			_, err = pgx.ForEachRow(rows, dest, func() error { fn(); return nil })
		}
		if err != nil {
			t.Fatalf("read %s: %v", what, err)
		}
	}
	var (
		id, reason string
		n          int
		sec        int64
	)
	query("effects", `SELECT msg_id, count(*) FROM `+chaos.EffectsTable+` GROUP BY msg_id`, []any{&id, &n},
		func() { o.effects[id] = n; o.rows += n })
	query("parked", `SELECT coalesce(dedupe_id, ''), reason, park_count FROM effectively.parked WHERE consumer = $1`, []any{&id, &reason, &n},
		func() { o.parked[id]++; o.reasons[reason]++; o.parkCount += n }, group)
	query("throughput", `SELECT floor(extract(epoch FROM at))::bigint, count(*) FROM `+chaos.EffectsTable+` GROUP BY 1`, []any{&sec, &n},
		func() { o.perSecond[sec] = n })
	if err := r.pool.QueryRow(ctx, `SELECT coalesce(min(at), now()), coalesce(max(at), now()) FROM `+chaos.EffectsTable).Scan(&o.first, &o.last); err != nil {
		t.Fatalf("read effect times: %v", err)
	}
	return o
}

// check runs the assertions, each as a subtest, after printing the report.
func (r *run) check() {
	o := r.collect()
	r.t.Log(r.report(o))
	p := r.prod
	p.mu.Lock()
	laneOf, poison := p.laneOf, p.poison
	p.mu.Unlock()

	r.t.Run("workers", func(t *testing.T) {
		for _, c := range r.crashes {
			t.Errorf("a worker exited without being killed: %s", c)
		}
	})

	r.t.Run("start", func(t *testing.T) {
		// Every partition that exists when the workers start is consumed
		// from once the group formed: a topic in Config.Topics that does
		// not exist yet must not keep the group from the others.
		moves := r.samp.firstMoves()
		bound := stallBound(timing)
		var late []string
		for _, k := range r.initialLanes {
			if m, ok := moves[k]; !ok {
				late = append(late, k.String()+" never")
			} else if d := m.Sub(r.begin); d > bound {
				late = append(late, fmt.Sprintf("%s after %.1fs", k, d.Seconds()))
			}
		}
		if len(late) > 0 {
			missing := ""
			if r.pl.topology {
				missing = fmt.Sprintf(" (%s not created yet)", topicNew)
			}
			t.Errorf("%d workers started with topics %s%s: %d of %d partitions first consumed from later than %s (stallBound): %s",
				r.pl.workers, strings.Join(r.topics, ", "), missing, len(late), len(r.initialLanes), bound, strings.Join(late, ", "))
		}
	})

	r.t.Run("exactly-once", func(t *testing.T) {
		want := 0
		missing := map[string]int{} // by topic/partition of the first copy
		var missingIDs, extra, doubled []string
		for i := range laneOf {
			id := msgID(i)
			n := o.effects[id]
			switch {
			case poison[i] && n > 0:
				extra = append(extra, fmt.Sprintf("%s (poison) ×%d", id, n))
			case poison[i]:
			case n == 0:
				missing[laneOf[i].String()]++
				missingIDs = append(missingIDs, id)
			case n > 1:
				doubled = append(doubled, fmt.Sprintf("%s ×%d", id, n))
			}
			if !poison[i] {
				want++
			}
		}
		for id := range o.effects {
			var i int
			if _, err := fmt.Sscanf(id, "m-%d", &i); err != nil || i >= len(laneOf) {
				extra = append(extra, id+" (never produced)")
			}
		}
		if o.rows != want || len(o.effects) != want || len(missingIDs)+len(extra)+len(doubled) > 0 {
			t.Errorf("%d effect rows for %d distinct messages, want exactly one for each of the %d non-poison logical messages", o.rows, len(o.effects), want)
		}
		if len(missingIDs) > 0 {
			t.Errorf("%d messages have no effect, by the partition of their first copy: %s; first ones: %s",
				len(missingIDs), countsString(missing), firstN(missingIDs, 10))
		}
		if len(doubled) > 0 {
			t.Errorf("%d messages have more than one effect: %s", len(doubled), firstN(doubled, 10))
		}
		if len(extra) > 0 {
			t.Errorf("%d effects for messages that should have none: %s", len(extra), firstN(extra, 10))
		}
	})

	r.t.Run("parked", func(t *testing.T) {
		var want, missing, doubled, wrong []string
		for i := range laneOf {
			id := msgID(i)
			switch n := o.parked[id]; {
			case poison[i] && n == 0:
				missing = append(missing, id)
			case poison[i] && n > 1:
				doubled = append(doubled, fmt.Sprintf("%s ×%d", id, n))
			case !poison[i] && n > 0:
				wrong = append(wrong, id)
			}
			if poison[i] {
				want = append(want, id)
			}
		}
		for id := range o.parked {
			var i int
			if _, err := fmt.Sscanf(id, "m-%d", &i); err != nil || i >= len(laneOf) {
				wrong = append(wrong, fmt.Sprintf("%q", id))
			}
		}
		total := 0
		for _, n := range o.parked {
			total += n
		}
		if total != len(want) || len(missing)+len(doubled)+len(wrong) > 0 {
			t.Errorf("%d parked rows, want one for each of the %d poison messages; reasons %s", total, len(want), countsString(o.reasons))
		}
		if len(missing) > 0 {
			t.Errorf("%d poison messages not parked: %s", len(missing), firstN(missing, 10))
		}
		if len(doubled) > 0 {
			t.Errorf("%d poison messages parked more than once: %s", len(doubled), firstN(doubled, 10))
		}
		if len(wrong) > 0 {
			t.Errorf("%d messages parked that are not poison: %s", len(wrong), firstN(wrong, 10))
		}
		if o.parkCount != total {
			t.Errorf("park_count sums to %d over %d rows: a parked message was parked again", o.parkCount, total)
		}
		if o.reasons["permanent"] != total {
			t.Errorf("parked reasons %s, want every one %q", countsString(o.reasons), "permanent")
		}
	})

	r.t.Run("offsets", func(t *testing.T) {
		if r.samp.count() < 20 {
			t.Errorf("only %d samples of the offsets table", r.samp.count())
		}
		for _, v := range r.samp.violations {
			t.Errorf("%s", v)
		}
		ends, pos := p.endsSnapshot(), r.samp.positions()
		var behind []string
		for _, k := range sortedLanes(ends) {
			if pos[k] != ends[k] {
				behind = append(behind, fmt.Sprintf("%s at %d of %d", k, pos[k], ends[k]))
			}
		}
		if len(behind) > 0 {
			t.Errorf("stored offsets not at the end of the log when the run ended: %s", strings.Join(behind, ", "))
		}
	})

	r.t.Run("stalls", func(t *testing.T) {
		bound := stallBound(timing)
		for i, ev := range r.events {
			switch ev.kind {
			case "kill", "freeze", "thaw":
			default:
				continue
			}
			if ev.noTx {
				t.Errorf("freeze %s at %s: the worker had no transaction in progress within 20s to be frozen in, so a frozen transaction's locks were not tried", ev.detail, r.since(ev.at))
			}
			st := r.stallAfter(i, false)
			if w := r.lockWaits[i]; st.lane != "" && st.d() > bound && len(w) > 0 {
				t.Logf("statements that waited for the frozen worker's locks (freeze %s): %s", ev.detail, strings.Join(w, "; "))
			}
			if excess, last := r.stallExcess(st); st.lane != "" && excess > bound {
				open := ""
				if st.open {
					open = ", and was still waiting when the run ended"
				}
				t.Errorf("%s %s at %s: partition %s had messages waiting and did not move for %s%s, %s after the last event before it moved again (%s); bound %s (SessionTimeout %s + RebalanceTimeout %s + slack, see stallBound)",
					ev.kind, ev.detail, r.since(ev.at), st.lane, st.d().Round(100*time.Millisecond), open, excess.Round(100*time.Millisecond), last, bound, timing.session, timing.rebalance)
			}
		}
		if r.pl.kills+r.pl.freezes > 0 && len(r.events) == 0 {
			t.Errorf("no chaos event happened")
		}
	})

	if r.pl.topology {
		r.t.Run("new-topic", func(t *testing.T) {
			if r.newTopicAt.IsZero() {
				t.Fatalf("the topic %s was never created", topicNew)
			}
			r.checkPickup(t, "new topic", r.newTopicAt, r.newLanes, o, laneOf, poison)
		})
		r.t.Run("added-partitions", func(t *testing.T) {
			if r.addedAt.IsZero() {
				t.Fatalf("partitions were never added to %s", topicA)
			}
			r.checkPickup(t, "added partition", r.addedAt, r.addLanes, o, laneOf, poison)
		})
	}
}

// checkPickup checks that each of lanes, created at at, was consumed
// within topologyBound and to its end.
func (r *run) checkPickup(t *testing.T, what string, at time.Time, lanes []laneKey, o outcome, laneOf []laneKey, poison []bool) {
	bound := topologyBound(timing)
	ends, pos, moves := r.prod.endsSnapshot(), r.samp.positions(), r.samp.firstMoves()
	in := map[laneKey]bool{}
	for _, l := range lanes {
		in[l] = true
	}
	want, got := map[laneKey]int{}, map[laneKey]int{}
	for i, l := range laneOf {
		if in[l] && !poison[i] {
			want[l]++
			if o.effects[msgID(i)] > 0 {
				got[l]++
			}
		}
	}
	for _, l := range lanes {
		switch m, ok := moves[l]; {
		case ends[l] == 0:
			t.Errorf("%s %s: nothing was produced to it", what, l)
		case !ok:
			t.Errorf("%s %s: %d of %d effects %s after it was created (stored offset %d of %d)",
				what, l, got[l], want[l], r.end.Sub(at).Round(time.Second), pos[l], ends[l])
		case m.Sub(at) > bound:
			t.Errorf("%s %s: first consumed %s after it was created, bound %s (see topologyBound)", what, l, m.Sub(at).Round(100*time.Millisecond), bound)
		}
		if _, ok := moves[l]; ok && got[l] != want[l] {
			t.Errorf("%s %s: %d of %d effects", what, l, got[l], want[l])
		}
	}
}

// attributionGrace is how long before an event a stall may have started
// and still be the event's: a partition's last move before a kill or a
// freeze comes a little before it.
const attributionGrace = time.Second

// eventOf returns the index of the event a stall is attributed to: the
// latest one at or before the stall's start (plus attributionGrace), or -1.
func (r *run) eventOf(st stall) int {
	e := -1
	for i, ev := range r.events {
		if !ev.at.After(st.start.Add(attributionGrace)) {
			e = i
		}
	}
	return e
}

// stallExcess returns how long st lasted after the last membership change
// (a kill or a freeze) that happened after it began, or all of st when
// none did: what stallBound bounds. It names that event. A thaw does not
// count: a stall that waited for a frozen worker must not pass because the
// worker came back.
func (r *run) stallExcess(st stall) (time.Duration, string) {
	excess, last := st.d(), "the stall's own"
	for _, ev := range r.events {
		if ev.kind != "kill" && ev.kind != "freeze" {
			continue
		}
		if ev.at.After(st.start) && ev.at.Before(st.end) {
			excess, last = st.end.Sub(ev.at), fmt.Sprintf("%s %s at %s", ev.kind, ev.detail, r.since(ev.at))
		}
	}
	return excess, last
}

// stallAfter returns the longest partition stall attributed to event i
// (the group's with group).
func (r *run) stallAfter(i int, group bool) stall {
	var worst stall
	for _, st := range r.samp.stallList(group) {
		if r.eventOf(st) == i && st.d() > worst.d() {
			worst = st
		}
	}
	return worst
}

var generationRE = regexp.MustCompile(`generation started.* generation=(\d+)`)

// generations counts the distinct group generations the workers started,
// from their logs: one per rebalance.
func (r *run) generations() int {
	seen := map[string]bool{}
	for _, p := range r.workers {
		f, err := os.Open(p.logPath)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if m := generationRE.FindStringSubmatch(sc.Text()); m != nil {
				seen[m[1]] = true
			}
		}
		f.Close()
	}
	return len(seen)
}
