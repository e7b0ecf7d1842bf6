package dedupe_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/dedupe"
)

func TestCanonicalJSON(t *testing.T) {
	same := [][2]string{
		{`{"amount":500,"to":"acct_9"}`, `{ "to": "acct_9", "amount": 500 }`},
		{`{"a":{"y":1,"x":[1, {"q":true,"p":null}]},"b":"s"}`, "{\n\t\"b\" : \"s\",\n\t\"a\" : {\"x\" : [ 1 , {\"p\":null , \"q\":true} ], \"y\":1}\n}"},
		{`{"\u0061":1}`, `{"a":1}`}, // keys compare decoded
		{`[]`, ` [ ] `},
	}
	for _, c := range same {
		a, err := dedupe.CanonicalJSON([]byte(c[0]))
		if err != nil {
			t.Fatalf("%s: %v", c[0], err)
		}
		b, err := dedupe.CanonicalJSON([]byte(c[1]))
		if err != nil {
			t.Fatalf("%s: %v", c[1], err)
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("%s and %s: %s and %s, want the same", c[0], c[1], a, b)
		}
	}
	if got, _ := dedupe.CanonicalJSON([]byte(`{ "to": "acct_9", "amount": 500 }`)); string(got) != `{"amount":500,"to":"acct_9"}` {
		t.Fatalf("canonical form %s", got)
	}
	differ := [][2]string{
		{`{"amount":500,"to":"acct_9"}`, `{"amount":501,"to":"acct_9"}`},
		{`{"amount":500}`, `{"amount":500.0}`}, // numbers as given
		{`{"amount":500}`, `{"amount":"500"}`}, // a string is not a number
		{`{"s":"\u00e9"}`, `{"s":"é"}`},        // strings as given
		{`[1,2]`, `[2,1]`},                     // arrays keep their order
		{`{"a":"x y"}`, `{"a":"xy"}`},          // whitespace inside a string counts
	}
	for _, c := range differ {
		a, err1 := dedupe.CanonicalJSON([]byte(c[0]))
		b, err2 := dedupe.CanonicalJSON([]byte(c[1]))
		if err1 != nil || err2 != nil {
			t.Fatalf("%v %v", err1, err2)
		}
		if bytes.Equal(a, b) {
			t.Fatalf("%s and %s have the same canonical form %s", c[0], c[1], a)
		}
	}
	for _, bad := range []string{``, `{`, `{"a":1} x`, `{"a":1}{"b":2}`, `{"a":1,"a":2}`, `[1,]`, `nope`, strings.Repeat("[", 1002) + strings.Repeat("]", 1002)} {
		if got, err := dedupe.CanonicalJSON([]byte(bad)); err == nil {
			t.Fatalf("%.40q: %.40q, want an error", bad, got)
		}
	}
}
