package bloom

import (
	"fmt"
	"testing"

	"github.com/bits-and-blooms/bloom/v3"

	"github.com/effectively-once/effectively/dedupe"
)

// TestTestAllAnswersAsTestLocations: the breadth-first filter tests of a
// claim plan give, for every (key, filter) pair, the answer
// TestLocations gives, with filters of different sizes and fill (some
// saturated, so that tests survive every round), and a filter of another
// shape, which is asked directly.
func TestTestAllAnswersAsTestLocations(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	filters := []*bloom.BloomFilter{
		newFilter(1000, s.cfg.FalsePositiveRate, s.k),
		newFilter(50, s.cfg.FalsePositiveRate, s.k), // overfilled below
		newFilter(1, s.cfg.FalsePositiveRate, s.k),  // the 64-bit minimum, saturated
		newFilter(777, 0.2, s.k),
		bloom.New(5000, s.k+3), // another k
	}
	for i, f := range filters {
		for j := range 400 * (i + 1) {
			if j%3 == i%3 {
				f.AddString(fmt.Sprintf("key-%d", j))
			}
		}
	}
	var keys []dedupe.Key
	var uniq []int
	for j := range 3000 {
		keys = append(keys, dedupe.Key{Scope: "s", ID: fmt.Sprintf("key-%d", j)})
		uniq = append(uniq, j)
	}
	var tests []filterTest
	for u := range uniq {
		for fi := range filters {
			if (u+fi)%4 != 0 { // not every key against every filter
				tests = append(tests, filterTest{pair: int32(u*len(filters) + fi), key: int32(u), filter: int32(fi)})
			}
		}
	}
	got := map[int32]bool{}
	for _, pair := range s.testAll(keys, uniq, filters, tests) {
		if got[pair] {
			t.Fatalf("pair %d answered twice", pair)
		}
		got[pair] = true
	}
	hits, misses := 0, 0
	for _, tt := range tests {
		f := filters[tt.filter]
		want := f.TestLocations(bloom.Locations([]byte(keys[uniq[tt.key]].ID), s.k))
		if got[tt.pair] != want {
			t.Fatalf("key %s against filter of %d bits: testAll says %v, TestLocations %v",
				keys[uniq[tt.key]].ID, f.Cap(), got[tt.pair], want)
		}
		if want {
			hits++
		} else {
			misses++
		}
	}
	if hits < 1000 || misses < 1000 {
		t.Fatalf("%d maybes and %d negatives: the test needs many of both", hits, misses)
	}
}
