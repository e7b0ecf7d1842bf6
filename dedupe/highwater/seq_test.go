package highwater_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/dedupe/highwater"
)

func TestParseSeq(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"1", 1}, {"42", 42}, {"007", 7}, {"9223372036854775807", 1<<63 - 1},
	} {
		got, err := highwater.ParseSeq(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSeq(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, reason string }{
		{"", "is empty"},
		{"0", "is zero"},
		{"000", "is zero"},
		{"-1", "is negative"},
		{"-99999999999999999999", "is negative"},
		{"9223372036854775808", "overflows"},
		{"123456789012345678901234567890", "overflows"},
		{"1.5", "not a decimal integer"},
		{"1e3", "not a decimal integer"},
		{"+5", "not a decimal integer"},
		{" 5", "not a decimal integer"},
		{"5\n", "not a decimal integer"},
		{"0x10", "not a decimal integer"},
		{"abc", "not a decimal integer"},
		{"٣", "not a decimal integer"}, // Arabic-Indic digit three
	} {
		n, err := highwater.ParseSeq(tc.in)
		var se *highwater.SeqError
		if err == nil || !errors.Is(err, highwater.ErrMalformedSeq) || !errors.As(err, &se) || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("ParseSeq(%q) = %d, %v; want an error saying %q", tc.in, n, err, tc.reason)
		}
	}
	// Long input is shortened in the error.
	_, err := highwater.ParseSeq(strings.Repeat("x", 10000))
	if err == nil || len(err.Error()) > 200 {
		t.Errorf("error for long input: %.300v", err)
	}
}

func TestHeaderKey(t *testing.T) {
	t.Parallel()
	lookup := func(h map[string]string) func(string) ([]byte, bool) {
		return func(name string) ([]byte, bool) {
			v, ok := h[name]
			return []byte(v), ok
		}
	}
	k, err := highwater.HeaderKey(lookup(map[string]string{"sender": "orders-7", "seq": "12"}), "", "")
	if err != nil || k.Sender != "orders-7" || k.Seq != 12 || k.Scope != "" || k.ID != "" {
		t.Errorf("HeaderKey = %+v, %v", k, err)
	}
	k, err = highwater.HeaderKey(lookup(map[string]string{"producer": "p", "n": "3"}), "producer", "n")
	if err != nil || k.Sender != "p" || k.Seq != 3 {
		t.Errorf("HeaderKey with names = %+v, %v", k, err)
	}
	for _, tc := range []struct {
		h      map[string]string
		is     error
		reason string
	}{
		{map[string]string{"seq": "1"}, highwater.ErrMissingHeader, `no "sender" header`},
		{map[string]string{"sender": "", "seq": "1"}, highwater.ErrMissingHeader, `"sender" naming the sender is empty`},
		{map[string]string{"sender": "a"}, highwater.ErrMissingHeader, `no "seq" header`},
		{map[string]string{"sender": "a", "seq": ""}, highwater.ErrMalformedSeq, "is empty"},
		{map[string]string{"sender": "a", "seq": "0"}, highwater.ErrMalformedSeq, "is zero"},
		{map[string]string{"sender": "a", "seq": "99999999999999999999"}, highwater.ErrMalformedSeq, "overflows"},
		{map[string]string{"sender": "a", "seq": "x1"}, highwater.ErrMalformedSeq, `header "seq": highwater: sequence number "x1" is not a decimal integer`},
	} {
		_, err := highwater.HeaderKey(lookup(tc.h), "", "")
		if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("HeaderKey(%v) error %v, want %v saying %q", tc.h, err, tc.is, tc.reason)
		}
	}
}
