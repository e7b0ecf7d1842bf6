package dedupetest

import (
	"math"
	"sync"

	"github.com/effectively-once/effectively/dedupe"
)

// testStatsReporter: ReportStats follows dedupe.CheckStats and reports at
// least one statistic, with finite values; claims change the values but
// not the names, kinds or help texts, nor their order; no counter goes
// down; and ReportStats may run while claims do (with -race, this checks
// that they share their state safely).
func testStatsReporter(e *env) {
	r := capability[dedupe.StatsReporter](e, "StatsReporter")
	before := e.report(r, "before any claim")
	if len(before) == 0 {
		e.Fatal("ReportStats returned no statistics; a strategy with none should not implement StatsReporter")
	}
	ks := e.keys("stats", 0, 20)
	e.expect("first claim", ks, e.claim(ks), all(newV, len(ks))...)
	e.expect("second claim", ks, e.claim(ks), all(dup, len(ks))...)
	after := e.report(r, "after two claims")
	e.sameStats(before, after)

	var wg sync.WaitGroup
	stop := make(chan struct{})
	reports := make(chan []dedupe.Stat, 1)
	wg.Go(func() {
		last := after
		for {
			select {
			case <-stop:
				reports <- last
				return
			default:
				last = r.ReportStats()
			}
		}
	})
	more := e.keys("stats", 20, 60)
	e.expect("claim while ReportStats runs", more, e.claim(more), all(newV, len(more))...)
	close(stop)
	wg.Wait()
	e.sameStats(after, <-reports)
	e.sameStats(after, e.report(r, "after the concurrent claim"))
}

// report calls ReportStats and checks the report on its own.
func (e *env) report(r dedupe.StatsReporter, when string) []dedupe.Stat {
	e.Helper()
	st := r.ReportStats()
	if err := dedupe.CheckStats(st); err != nil {
		e.Errorf("ReportStats %s: %v", when, err)
	}
	for _, s := range st {
		if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
			e.Errorf("ReportStats %s: %s = %v", when, s.Name, s.Value)
		}
		if s.Kind == dedupe.StatCounter && s.Value < 0 {
			e.Errorf("ReportStats %s: counter %s = %v", when, s.Name, s.Value)
		}
	}
	return st
}

// sameStats checks that later has the statistics of earlier, in order,
// and that no counter went down.
func (e *env) sameStats(earlier, later []dedupe.Stat) {
	e.Helper()
	if len(later) != len(earlier) {
		e.Fatalf("ReportStats returned %d statistics, then %d", len(earlier), len(later))
	}
	for i, a := range earlier {
		b := later[i]
		if a.Name != b.Name || a.Kind != b.Kind || a.Help != b.Help {
			e.Errorf("statistic %d: %s (%s, %q), then %s (%s, %q)", i, a.Name, a.Kind, a.Help, b.Name, b.Kind, b.Help)
			continue
		}
		if a.Kind == dedupe.StatCounter && b.Value < a.Value {
			e.Errorf("counter %s went down from %v to %v", a.Name, a.Value, b.Value)
		}
	}
}
