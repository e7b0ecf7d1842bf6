package bench

import "testing"

// TestSearchRate checks the search for the highest sustained rate against
// known limits: it doubles, then bisects to within 10%, and halves first
// when the starting rate is already too high.
func TestSearchRate(t *testing.T) {
	for _, limit := range []float64{50, 3000, 5000, 37000, 150000, 5e6} {
		var probes []float64
		got, err := searchRate(5000, func(r float64) (bool, error) {
			probes = append(probes, r)
			return r <= limit, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case limit < 100:
			if got != 0 {
				t.Errorf("limit %v: found %v, want 0 (nothing sustained)", limit, got)
			}
		case limit > searchCeiling:
			if got <= searchCeiling/2 {
				t.Errorf("limit %v: found %v, want the ceiling's last doubling", limit, got)
			}
		case got > limit || got < limit/1.1:
			t.Errorf("limit %v: found %v (probes %v), want within 10%% below it", limit, got, probes)
		}
		if len(probes) > 20 {
			t.Errorf("limit %v: %d probes", limit, len(probes))
		}
	}
}
