package consumertest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
)

func refs(b *consumer.Batch) []string {
	var out []string
	for _, m := range b.Messages {
		out = append(out, m.Ref)
	}
	return out
}

// Binary refs are distinct, stable across redeliveries, not valid text, and
// collide in groups of four once made valid text.
func TestBinaryRefs(t *testing.T) {
	b := consumertest.New(consumertest.Config{Lanes: 1, BinaryRefs: true})
	for i := range 8 {
		b.Publish(0, consumer.Message{ID: fmt.Sprint(i)})
	}
	first := fetch(t, b, 8)
	got := refs(first)
	seen := map[string]bool{}
	cleaned := map[string]int{}
	for _, r := range got {
		if seen[r] {
			t.Errorf("ref %q given twice", r)
		}
		seen[r] = true
		if utf8.ValidString(r) && !strings.ContainsRune(r, 0) {
			t.Errorf("ref %q is valid text", r)
		}
		cleaned[strings.ReplaceAll(strings.ToValidUTF8(r, "\uFFFD"), "\x00", "\uFFFD")]++
	}
	if len(cleaned) != 2 || cleaned["lane-0@0\uFFFD"] != 4 || cleaned["lane-0@1\uFFFD"] != 4 {
		t.Errorf("made valid text, the refs are %v; want two groups of four", cleaned)
	}
	if got[0] != consumertest.Ref("lane-0", 0, true) || got[5] != "lane-0@1\xff" {
		t.Errorf("refs %q do not follow Ref", got)
	}
	if err := b.Settle(context.Background(), first, nil, nil); err != nil { // all abandoned
		t.Fatal(err)
	}
	if again := refs(fetch(t, b, 8)); fmt.Sprintf("%q", again) != fmt.Sprintf("%q", got) {
		t.Errorf("redelivered with refs %q, first delivered with %q", again, got)
	}
}

// A lane that restarts its offsets gives the same ref to different messages.
func TestRestartOffsetsEveryMakesRefsRecur(t *testing.T) {
	b := consumertest.New(consumertest.Config{Lanes: 1, RestartOffsetsEvery: 3})
	for i := range 7 {
		b.Publish(0, consumer.Message{ID: fmt.Sprint(i)})
	}
	batch := fetch(t, b, 10)
	if got := fmt.Sprint(refs(batch)); got != "[lane-0@0 lane-0@1 lane-0@2 lane-0@0 lane-0@1 lane-0@2 lane-0@0]" {
		t.Errorf("refs %s", got)
	}
	if got := fmt.Sprint(ids(batch)); got != "[0 1 2 3 4 5 6]" {
		t.Errorf("messages %s: each is still its own message", got)
	}
}

// Nil stays nil and empty stays empty, and each delivery is a copy.
func TestDeliveriesKeepNilAndAreCopies(t *testing.T) {
	b := consumertest.New(consumertest.Config{Lanes: 1})
	b.Publish(0, consumer.Message{ID: "nil"})
	b.Publish(0, consumer.Message{ID: "empty", Key: []byte{}, Value: []byte{}, Headers: []consumer.Header{{Key: "h", Value: []byte{}}}})
	b.Publish(0, consumer.Message{ID: "full", Value: []byte("v")})
	batch := fetch(t, b, 3)
	n, e, f := batch.Messages[0], batch.Messages[1], batch.Messages[2]
	if n.Value != nil || n.Key != nil || n.Headers != nil {
		t.Errorf("nil message delivered as %+v", n)
	}
	if e.Value == nil || len(e.Value) != 0 || e.Key == nil || e.Headers[0].Value == nil {
		t.Errorf("empty message delivered as %+v", e)
	}
	f.Value[0] = 'X'
	if err := b.Settle(context.Background(), batch, nil, nil); err != nil {
		t.Fatal(err)
	}
	if again := fetch(t, b, 3); string(again.Messages[2].Value) != "v" {
		t.Errorf("a handler's change to one delivery reached the next: %q", again.Messages[2].Value)
	}
}

func TestPendingListsUnacknowledged(t *testing.T) {
	b := consumertest.New(consumertest.Config{Lanes: 2})
	for i := range 4 {
		b.Publish(i%2, consumer.Message{ID: fmt.Sprint(i)})
	}
	batch := fetch(t, b, 1)
	if err := b.Settle(context.Background(), batch, batch.Messages, nil); err != nil {
		t.Fatal(err)
	}
	inflight := fetch(t, b, 1)
	var got []string
	for _, p := range b.Pending() {
		got = append(got, fmt.Sprintf("%s:%d:%v", p.Message.ID, p.Deliveries, p.InFlight))
	}
	want := map[string]string{ // which lane went first is the broker's choice; lane 0 is listed first
		"0": "[2:0:false 1:1:true 3:0:false]",
		"1": "[0:1:true 2:0:false 3:0:false]",
	}[batch.Messages[0].ID]
	if fmt.Sprint(got) != want || inflight == nil {
		t.Errorf("pending %v, want %s", got, want)
	}
}
