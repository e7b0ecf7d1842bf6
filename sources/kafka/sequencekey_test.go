package kafka

import (
	"errors"
	"testing"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe/highwater"
)

// TestSequenceKeyParsesLikeHighwater: SequenceKey accepts exactly the
// sequence text that highwater.ParseSeq accepts, with the same number, so
// one message gets one verdict whichever path parses it.
func TestSequenceKeyParsesLikeHighwater(t *testing.T) {
	kf := SequenceKey("sender", "seq")
	for _, raw := range []string{
		"1", "42", "007", "9223372036854775807",
		" 7", "7 ", "+7", "\t7", "7\n", "-7", "0", "00", "1.0", "1e3", "0x10", "٣", "9223372036854775808",
	} {
		m := &consumer.Message{ID: "id", Headers: []consumer.Header{{Key: "sender", Value: []byte("svc")}, {Key: "seq", Value: []byte(raw)}}}
		k, err := kf(m)
		want, werr := highwater.ParseSeq(raw)
		switch {
		case werr != nil && err == nil:
			t.Errorf("SequenceKey accepts %q as %d; highwater.ParseSeq rejects it: %v", raw, k.Seq, werr)
		case werr == nil && err != nil:
			t.Errorf("SequenceKey rejects %q (%v); highwater.ParseSeq reads %d", raw, err, want)
		case werr == nil && (k.Seq != want || k.Sender != "svc" || k.ID != "id"):
			t.Errorf("SequenceKey(%q) = %+v, want sender svc, seq %d, ID id", raw, k, want)
		case werr != nil && !errors.Is(err, highwater.ErrMalformedSeq):
			t.Errorf("SequenceKey(%q): %v, want an error matching highwater.ErrMalformedSeq", raw, err)
		}
	}
}
