package dedupe

// The implementation of CanonicalJSON before it became one pass, kept as
// the reference the one-pass form must agree with byte for byte (every
// stored fingerprint depends on it), under its own depth limit.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// referenceCanonicalJSON is CanonicalJSON as it was.
func referenceCanonicalJSON(doc []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var out bytes.Buffer
	out.Grow(len(doc))
	if err := refValue(dec, &out, 0); err != nil {
		return nil, fmt.Errorf("dedupe: canonical JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("dedupe: canonical JSON: more after the value")
	}
	return out.Bytes(), nil
}

// refMaxDepth bounds the nesting referenceCanonicalJSON follows.
const refMaxDepth = 1000

// refValue writes the next value of dec. Strings and numbers are copied
// from the input as given, through the decoder's raw messages.
func refValue(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return err
	}
	return refRaw(raw, out, depth)
}

// refRaw writes the canonical form of one raw JSON value.
func refRaw(raw json.RawMessage, out *bytes.Buffer, depth int) error {
	if depth > refMaxDepth {
		return errors.New("nested too deep")
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return errors.New("empty value")
	}
	switch raw[0] {
	case '{':
		var members map[string]json.RawMessage
		if err := refUniqueKeys(raw); err != nil {
			return err
		}
		if err := json.Unmarshal(raw, &members); err != nil {
			return err
		}
		keys := make([]string, 0, len(members))
		for k := range members {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		out.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				out.WriteByte(',')
			}
			kb, err := json.Marshal(k)
			if err != nil {
				return err
			}
			out.Write(kb)
			out.WriteByte(':')
			if err := refRaw(members[k], out, depth+1); err != nil {
				return err
			}
		}
		out.WriteByte('}')
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return err
		}
		out.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				out.WriteByte(',')
			}
			if err := refRaw(it, out, depth+1); err != nil {
				return err
			}
		}
		out.WriteByte(']')
	default:
		// A string, number, true, false or null: as given.
		out.Write(raw)
	}
	return nil
}

// refUniqueKeys returns an error when the object raw names a member
// twice (json.Unmarshal would keep the last silently).
func refUniqueKeys(raw json.RawMessage) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // {
		return err
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		k, _ := t.(string)
		if seen[k] {
			return fmt.Errorf("member %q named twice", strings.ToValidUTF8(k, "\uFFFD"))
		}
		seen[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return err
		}
	}
	return nil
}

// canonicalCorpus is JSON of every shape CanonicalJSON meets: escapes and
// unicode in keys and values, numbers in every notation, whitespace,
// duplicate and out-of-order members, and what is not JSON.
var canonicalCorpus = []string{
	`{}`, `[]`, `""`, `0`, `-0`, `1.5e-7`, `-12.50E+3`, `true`, `false`, `null`,
	` {"b" : 1 , "a" : [ 1 , 2.0 , -0.0 , 1e5 , 1E+5 ] } `,
	"\t\n\r{\"z\":{\"y\":{\"x\":{}}},\"a\":[[[]]]}\n",
	`{"a":1,"a":2}`, `{"a":1,"\u0061":2}`, `{"b":1,"a":2,"b":3}`, `{"b":{"x":1,"x":1},"a":2}`,
	`{"\u00e9":1,"é":2}`, `{"é":"\u00e9","e":"é"}`, `{"<>&":"<>&","\u003c":"\u003e"}`,
	`{"\ud83d\ude00":1,"😀x":2}`, `{"\ud800":1}`, `{"\udc00\ud800":1,"\ud800\u0041":2}`, `{"\ud800\ud800":1}`,
	`{"\u2028":1,"\u2029":2," ":3}`, "{\"\u2028\u2029x\":1}",
	"{\"\xff\":1}", "{\"a\xffb\":1,\"a\xfeb\":2}", "{\"\xed\xa0\x80\":1}", "[\"\xff\xfe\"]",
	`{"\b\f\n\r\t\"\\\/":1,"\u0001\u001f\u007f":2,"\u0000":3}`, "{\"\x7f\":1}",
	`{"A":1,"a":2,"_":3,"0":4,"":5," ":6}`, `{"":1,"":2}`,
	`{"k":"\"quoted\" and \\ back","j":"tab\there"}`,
	`[{"b":2,"a":1},{"d":[{"f":1,"e":2}],"c":3}]`,
	`[1, "two", {"three": 3}, [4], null, true, false]`,
	``, ` `, `{`, `}`, `[`, `]`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{,"a":1}`, `[1,]`, `[,1]`, `[1 2]`,
	`{"a":1} x`, `{"a":1}{"b":2}`, `1 2`, `nope`, `tru`, `nul`, `falsey`, `01`, `-`, `1.`, `.5`, `+1`, `1e`, `1e+`, `0x10`,
	`"unterminated`, `"bad \x escape"`, `"\u12"`, `"\u12g4"`, "\"ctl\x01char\"", "\"nl\nin\"", `'single'`,
	"\xef\xbb\xbf{}", `{"a":1}]`, `[1]]`, `{"a" 1}`, `{1:2}`, `NaN`, `Infinity`, `-Infinity`,
	`{"a":[1,{"b":[2,{"c":[3]}]}],"a2":{"b":{"c":{"d":{}}}}}`,
	strings.Repeat("[", MaxJSONDepth) + strings.Repeat("]", MaxJSONDepth),
	strings.Repeat("[", MaxJSONDepth+1) + strings.Repeat("]", MaxJSONDepth+1),
	strings.Repeat(`{"a":`, MaxJSONDepth) + "1" + strings.Repeat("}", MaxJSONDepth),
	strings.Repeat(`{"a":`, MaxJSONDepth+1) + "1" + strings.Repeat("}", MaxJSONDepth+1),
}

// randomJSON writes a random document of up to depth levels, its keys and
// strings drawn from pieces that exercise escaping, with random
// whitespace.
func randomJSON(r *rand.Rand, b *strings.Builder, depth int) {
	pieces := []string{"a", "b", "é", `\u00e9`, `\u0061`, `\"`, `\\`, `\/`, `\n`, `\u0000`, `\u001f`, "<", "&", `\u003c`,
		`\ud83d\ude00`, "😀", `\ud800`, `\udfff`, "\xff", "\u2028", `\u2029`, " ", "z", "0", "~", "\x7f"}
	ws := func() {
		if r.IntN(4) == 0 {
			b.WriteString([]string{" ", "\t", "\n", "\r\n", "  "}[r.IntN(5)])
		}
	}
	str := func() {
		b.WriteByte('"')
		for range r.IntN(4) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		b.WriteByte('"')
	}
	ws()
	switch k := r.IntN(8); {
	case depth > 0 && k < 2:
		b.WriteByte('{')
		for i := range r.IntN(6) {
			if i > 0 {
				b.WriteByte(',')
			}
			ws()
			str()
			ws()
			b.WriteByte(':')
			randomJSON(r, b, depth-1)
		}
		ws()
		b.WriteByte('}')
	case depth > 0 && k < 4:
		b.WriteByte('[')
		for i := range r.IntN(5) {
			if i > 0 {
				b.WriteByte(',')
			}
			randomJSON(r, b, depth-1)
		}
		ws()
		b.WriteByte(']')
	case k < 6:
		str()
	default:
		b.WriteString([]string{"0", "-0", "1.0", "1e3", "-2.5E-3", "123456789012345678901234567890", "true", "false", "null"}[r.IntN(9)])
	}
	ws()
}

// checkCanonical checks CanonicalJSON on doc against the reference and
// encoding/json.
func checkCanonical(t *testing.T, doc []byte) {
	t.Helper()
	got, err := CanonicalJSON(doc)
	switch {
	case errors.Is(err, errJSONTooDeep):
		// Deeper than the limit: the reference, whose limit is higher, may
		// take it.
		return
	case err == nil && !json.Valid(doc):
		t.Fatalf("%q: canonical form %q, but encoding/json finds it invalid", doc, got)
	case err != nil && json.Valid(doc) && !errors.Is(err, errJSONDuplicate):
		t.Fatalf("%q: %v, but encoding/json finds it valid", doc, err)
	}
	want, refErr := referenceCanonicalJSON(doc)
	if (err == nil) != (refErr == nil) {
		t.Fatalf("%q: error %v, the reference's %v", doc, err, refErr)
	}
	if err != nil {
		return
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%q: canonical form\n%q, the reference's\n%q", doc, got, want)
	}
	again, err := CanonicalJSON(got)
	if err != nil || !bytes.Equal(again, got) {
		t.Fatalf("%q: canonical form %q, canonical again %q, %v", doc, got, again, err)
	}
}

// TestCanonicalJSONMatchesReference holds the one-pass CanonicalJSON to
// the form of the implementation it replaced, byte for byte: fingerprints
// stored before must still match.
func TestCanonicalJSONMatchesReference(t *testing.T) {
	t.Parallel()
	for _, doc := range canonicalCorpus {
		checkCanonical(t, []byte(doc))
	}
	for _, body := range canonicalBodies(16 << 10) {
		checkCanonical(t, []byte(body.doc))
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		var b strings.Builder
		randomJSON(r, &b, 1+r.IntN(5))
		checkCanonical(t, []byte(b.String()))
	}
}

// FuzzCanonicalJSON checks that CanonicalJSON takes what encoding/json
// takes (less duplicate members and too deep nesting), agrees with the
// reference, and that its form is its own canonical form.
func FuzzCanonicalJSON(f *testing.F) {
	for _, doc := range canonicalCorpus {
		f.Add([]byte(doc))
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 50 {
		var b strings.Builder
		randomJSON(r, &b, 4)
		f.Add([]byte(b.String()))
	}
	f.Fuzz(checkCanonical)
}
