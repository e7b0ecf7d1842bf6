package dedupetest_test

import (
	"fmt"
	"sync/atomic"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
)

// Broken StatsReporters, each caught by the StatsReporter subtest.
func init() {
	for name, b := range map[string]brokenCase{
		// A counter that goes down.
		"shrinking": {wrap: func(s *idset.Strategy) dedupe.Strategy { return &shrinking{Strategy: s} }, catches: []string{"StatsReporter"}},
		// Names that change from one report to the next.
		"shifting": {wrap: func(s *idset.Strategy) dedupe.Strategy { return &shifting{Strategy: s} }, catches: []string{"StatsReporter"}},
		// A name that is not snake_case.
		"shouting": {wrap: func(s *idset.Strategy) dedupe.Strategy { return shouting{s} }, catches: []string{"StatsReporter"}},
	} {
		broken[name] = b
	}
}

type shrinking struct {
	*idset.Strategy
	n atomic.Int64
}

func (s *shrinking) ReportStats() []dedupe.Stat {
	return []dedupe.Stat{{Name: "reports_total", Help: "Counts down.", Kind: dedupe.StatCounter, Value: float64(1000 - s.n.Add(1))}}
}

type shifting struct {
	*idset.Strategy
	n atomic.Int64
}

func (s *shifting) ReportStats() []dedupe.Stat {
	return []dedupe.Stat{{Name: fmt.Sprintf("report_%d_total", s.n.Add(1)), Help: "Renamed on every call.", Kind: dedupe.StatCounter, Value: 1}}
}

type shouting struct{ *idset.Strategy }

func (shouting) ReportStats() []dedupe.Stat {
	return []dedupe.Stat{{Name: "Keys_Total", Help: "Not snake_case.", Kind: dedupe.StatCounter, Value: 1}}
}
