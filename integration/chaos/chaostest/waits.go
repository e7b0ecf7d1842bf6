package chaostest

import (
	"strings"
	"time"
)

// genQuiet is how long no new generation may appear for the group to
// count as settled: a member that resumed or joined rejoins within a few
// heartbeats.
const genQuiet = 3 * time.Second

// waitStable waits at least minGap, then until the group settled: every
// partition that was consumed before moved within the last 1.5s, a
// generation newer than newGenAfter (for membership changes that cause a
// rebalance; zero for none) and then none for genQuiet, and each of fresh
// (partitions just added) consumed from. It gives up after 2×stallBound (topologyBound with
// fresh), and the checks report the rest. Waiting for the new partitions
// keeps a later kill's rebalance from picking them up in the group's
// stead.
func (r *run) waitStable(what string, minGap time.Duration, fresh []laneKey, newGenAfter time.Time) {
	start := time.Now()
	limit := 2 * stallBound(timing)
	if len(fresh) > 0 {
		limit = topologyBound(timing)
	}
	for r.ctx.Err() == nil {
		r.checkCrashes()
		longest, lane, _ := r.samp.current()
		moves := r.samp.firstMoves()
		unseen := 0
		for _, k := range fresh {
			if _, ok := moves[k]; !ok {
				unseen++
			}
		}
		el := time.Since(start)
		if len(moves) == 0 && el >= minGap {
			return // nothing was ever consumed: there is nothing to recover (the start check reports it)
		}
		gen := r.samp.generationChanged()
		genOK := time.Since(gen) >= genQuiet && (newGenAfter.IsZero() || gen.After(newGenAfter))
		if el >= minGap && longest < 1500*time.Millisecond && unseen == 0 && genOK && r.samp.count() > 0 {
			return
		}
		if el > limit {
			r.t.Logf("%s: not settled after %s (%s has waited %s, %d new partitions never consumed from, last new generation %s); going on",
				what, el.Round(time.Millisecond), lane, longest.Round(time.Millisecond), unseen, r.since(gen))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitFirstConsumed waits until every partition produced to so far has
// been consumed from, or 2×stallBound passed (then it logs what it saw and
// the checks report the rest).
func (r *run) waitFirstConsumed() {
	start := time.Now()
	for r.ctx.Err() == nil {
		r.checkCrashes()
		pos := r.samp.positions()
		var waiting []string
		for k := range r.prod.endsSnapshot() {
			if pos[k] == 0 {
				waiting = append(waiting, k.String())
			}
		}
		if len(waiting) == 0 && r.samp.count() > 0 {
			r.t.Logf("every partition consumed from %s after the workers started", time.Since(start).Round(time.Millisecond))
			return
		}

		if time.Since(start) > 2*stallBound(timing) {
			r.t.Logf("%d workers started %s ago, and %d partitions were never consumed from: %s; going on",
				len(r.live), time.Since(start).Round(time.Millisecond), len(waiting), strings.Join(waiting, " "))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitFor polls cond until it holds; it fails the test when the run's
// deadline passes first.
func (r *run) waitFor(what string, cond func() bool) {
	r.t.Helper()
	for !cond() {
		if r.ctx.Err() != nil {
			r.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// noProgress is how long the end of the run waits with no partition moving
// before it gives up on the rest and reports.
const noProgress = 60 * time.Second

// waitCaughtUp waits until every partition's stored offset reached the end
// of its log, or nothing moved for noProgress since it began waiting (a
// quiet spell before, when the producer had nothing to send, does not
// count: the messages flushed just now are what it waits for).
func (r *run) waitCaughtUp() {
	start := time.Now()
	for r.ctx.Err() == nil {
		r.checkCrashes()
		ends, pos := r.prod.endsSnapshot(), r.samp.positions()
		behind := 0
		for k, e := range ends {
			if pos[k] < e {
				behind++
			}
		}
		if behind == 0 {
			return
		}
		if _, _, since := r.samp.current(); min(since, time.Since(start)) > noProgress {
			r.t.Logf("%d partitions behind and nothing moved for %s; checking what there is", behind, noProgress)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.t.Logf("the run's deadline (%s) passed before every partition was consumed", r.pl.deadline)
}
