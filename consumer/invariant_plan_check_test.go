package consumer_test

import (
	"fmt"
	"testing"
)

// The invariant test's generator keeps the rules its checks rely on: a
// plan is the same for the same seed; a sender's messages are in one lane,
// numbered 1, 2, 3… without holes, and published in order; every producer
// copy comes after its original, with the same key and value; and every
// run has poison of each kind and nil values among good and poison
// messages.
func TestInvariantPlan(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 200; seed++ {
		p := newPlan(seed, planOptions{})
		if q := newPlan(seed, planOptions{}); fmt.Sprint(describeOrder(q)) != fmt.Sprint(describeOrder(p)) || q.String() != p.String() {
			t.Fatalf("seed %d: two plans differ", seed)
		}
		laneOf := map[string]int{}
		for lane, seq := range p.order {
			next := map[string]int64{}
			seen := map[*logical]bool{}
			for _, s := range seq {
				l := s.logical
				if s.lane != lane {
					t.Fatalf("seed %d: copy #%d in lane %d says lane %d", seed, s.serial, lane, s.lane)
				}
				if prev, ok := laneOf[l.sender]; ok && prev != lane {
					t.Fatalf("seed %d: sender %s in lanes %d and %d", seed, l.sender, prev, lane)
				}
				laneOf[l.sender] = lane
				if s == l.copies[0] {
					if seen[l] {
						t.Fatalf("seed %d: %s published before its original", seed, l.id)
					}
					if l.kind != poisonKey {
						if l.seq != next[l.sender]+1 {
							t.Fatalf("seed %d: %s is %s#%d after #%d", seed, l.id, l.sender, l.seq, next[l.sender])
						}
						next[l.sender] = l.seq
					}
				} else if !seen[l] {
					t.Fatalf("seed %d: copy #%d of %s before its original", seed, s.serial, l.id)
				}
				seen[l] = true
				m := s.msg()
				o := l.copies[0].msg()
				if m.ID != o.ID || fmt.Sprintf("%q", m.Value) != fmt.Sprintf("%q", o.Value) || (m.Value == nil) != (o.Value == nil) {
					t.Fatalf("seed %d: copy #%d of %s differs from the original", seed, s.serial, l.id)
				}
			}
		}
		for k := poisonPermanent; k <= poisonKey; k++ {
			if n, _ := p.count(k); n == 0 {
				t.Errorf("seed %d: no %s message", seed, k)
			}
		}
		nilGood, nilPoison := false, false
		for _, l := range p.logicals {
			if l.value == nil {
				nilGood = nilGood || !l.kind.poison()
				nilPoison = nilPoison || l.kind.poison()
			}
		}
		if !nilGood || !nilPoison {
			t.Errorf("seed %d: nil values: among good %v, among poison %v", seed, nilGood, nilPoison)
		}
	}
}

func describeOrder(p *plan) [][]int {
	out := make([][]int, len(p.order))
	for lane, seq := range p.order {
		for _, s := range seq {
			out[lane] = append(out[lane], s.serial)
		}
	}
	return out
}
