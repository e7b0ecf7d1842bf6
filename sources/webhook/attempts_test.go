package webhook

import "testing"

func TestAttempts(t *testing.T) {
	a := newAttempts(2)
	for want := 1; want <= 3; want++ {
		if got := a.next("a"); got != want {
			t.Fatalf("delivery %d of a counted %d", want, got)
		}
	}
	a.undo("a")
	if got := a.next("a"); got != 3 {
		t.Fatalf("after an undo, the next delivery of a counted %d, want 3", got)
	}
	a.next("b")
	a.next("a") // a is now seen more recently than b
	a.next("c") // evicts b
	if got := a.len(); got != 2 {
		t.Fatalf("%d events tracked, want the bound 2", got)
	}
	if got := a.next("b"); got != 1 {
		t.Fatalf("b was evicted, yet its next delivery counted %d", got)
	}
	if got := a.next("b"); got != 2 {
		t.Fatalf("b counted %d, want 2", got)
	}
	a.forget("b")
	if got := a.next("b"); got != 1 {
		t.Fatalf("b was acknowledged, yet its next delivery counted %d", got)
	}
	a.undo("b")
	a.undo("b") // nothing left to undo
	if got := a.next("b"); got != 1 {
		t.Fatalf("after undoing b's only delivery, the next counted %d", got)
	}
}
