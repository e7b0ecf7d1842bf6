package dedupe_test

import (
	"strings"
	"testing"

	"github.com/effectively-once/effectively/dedupe"
)

func TestCheckStats(t *testing.T) {
	t.Parallel()
	ok := dedupe.Stat{Name: "cache_hits_total", Help: "Hits.", Kind: dedupe.StatCounter, Value: 3}
	gauge := dedupe.Stat{Name: "cache_entries", Help: "Entries.", Kind: dedupe.StatGauge, Value: -1}
	if err := dedupe.CheckStats([]dedupe.Stat{ok, gauge}); err != nil {
		t.Errorf("a valid report: %v", err)
	}
	if err := dedupe.CheckStats(nil); err != nil {
		t.Errorf("an empty report: %v", err)
	}
	with := func(f func(*dedupe.Stat)) dedupe.Stat { s := ok; f(&s); return s }
	for _, tc := range []struct {
		what  string
		stats []dedupe.Stat
		want  string
	}{
		{"an empty name", []dedupe.Stat{with(func(s *dedupe.Stat) { s.Name = "" })}, "not snake_case"},
		{"capitals", []dedupe.Stat{with(func(s *dedupe.Stat) { s.Name = "Hits_total" })}, "not snake_case"},
		{"a dash", []dedupe.Stat{with(func(s *dedupe.Stat) { s.Name = "cache-hits_total" })}, "not snake_case"},
		{"a leading digit", []dedupe.Stat{with(func(s *dedupe.Stat) { s.Name = "1_total" })}, "not snake_case"},
		{"a repeated name", []dedupe.Stat{ok, gauge, ok}, "reported twice"},
		{"no help", []dedupe.Stat{with(func(s *dedupe.Stat) { s.Help = "" })}, "no help"},
		{"no kind", []dedupe.Stat{with(func(s *dedupe.Stat) { s.Kind = 0 })}, "invalid kind"},
		{"an unknown kind", []dedupe.Stat{with(func(s *dedupe.Stat) { s.Kind = 9 })}, "invalid kind"},
		{"a counter without _total", []dedupe.Stat{with(func(s *dedupe.Stat) { s.Name = "cache_hits" })}, "ends in _total"},
		{"a counter named _total", []dedupe.Stat{with(func(s *dedupe.Stat) { s.Name = "_total" })}, "not snake_case"},
	} {
		err := dedupe.CheckStats(tc.stats)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.what, err, tc.want)
		}
	}
}

func TestStatKindString(t *testing.T) {
	t.Parallel()
	for k, want := range map[dedupe.StatKind]string{dedupe.StatCounter: "counter", dedupe.StatGauge: "gauge", 0: "invalid"} {
		if got := k.String(); got != want {
			t.Errorf("StatKind(%d).String() = %q, want %q", k, got, want)
		}
	}
}
