package dedupe

import (
	"fmt"
	"regexp"
)

// StatsReporter is implemented by strategies that count what they do in
// memory (cache hits, filter checks, gaps seen): the numbers an operator
// graphs beside the consumer's own. ReportStats returns them as named
// counters and gauges, so that a metrics adapter (metrics/effprom) exports
// any strategy's statistics by type assertion, without knowing the
// strategy. What the strategy stores in its tables is Inspector's.
type StatsReporter interface {
	// ReportStats returns the strategy's statistics now. Every call
	// returns the same names, kinds and help texts in the same order; only
	// the values change. It is safe for concurrent use with Claim.
	ReportStats() []Stat
}

// StatKind says how a Stat's value changes.
type StatKind uint8

const (
	// StatCounter counts from the strategy's creation and never goes
	// down. Its name ends in "_total".
	StatCounter StatKind = iota + 1
	// StatGauge is a value now, which goes up and down (entries in a
	// cache, a measured rate).
	StatGauge
)

// String returns the kind's lower-case name.
func (k StatKind) String() string {
	switch k {
	case StatCounter:
		return "counter"
	case StatGauge:
		return "gauge"
	}
	return "invalid"
}

// Stat is one statistic a StatsReporter reports.
type Stat struct {
	// Name names the statistic within its strategy, in snake_case
	// ([a-z][a-z0-9_]*), such as "cache_hits_total". effprom exports it
	// as <namespace>_<strategy name>_<Name>.
	Name string
	// Help says what it counts or measures, in one sentence.
	Help  string
	Kind  StatKind
	Value float64
}

var statNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// CheckStats reports the first of stats that breaks the rules of Stat: a
// name that is not snake_case or repeats, an empty help text, an invalid
// kind, or a counter whose name does not end in "_total". Adapters check
// a strategy's report with it before exporting it.
func CheckStats(stats []Stat) error {
	seen := make(map[string]bool, len(stats))
	for _, s := range stats {
		switch {
		case !statNameRE.MatchString(s.Name):
			return fmt.Errorf("dedupe: stat %q: the name is not snake_case ([a-z][a-z0-9_]*)", s.Name)
		case seen[s.Name]:
			return fmt.Errorf("dedupe: stat %q: reported twice", s.Name)
		case s.Help == "":
			return fmt.Errorf("dedupe: stat %q: no help text", s.Name)
		case s.Kind != StatCounter && s.Kind != StatGauge:
			return fmt.Errorf("dedupe: stat %q: invalid kind %d", s.Name, s.Kind)
		case s.Kind == StatCounter && !hasTotalSuffix(s.Name):
			return fmt.Errorf("dedupe: stat %q: a counter's name ends in _total", s.Name)
		}
		seen[s.Name] = true
	}
	return nil
}

func hasTotalSuffix(name string) bool {
	const suffix = "_total"
	return len(name) > len(suffix) && name[len(name)-len(suffix):] == suffix
}
