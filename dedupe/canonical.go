package dedupe

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// CanonicalJSON returns doc in a canonical form, for fingerprints that a
// producer's re-serialization does not change: object members sorted by
// key (byte order of the decoded key, written as encoding/json writes it),
// no whitespace between tokens, and every number and string value exactly
// as given (1.0 stays 1.0, "\u00e9" stays escaped). Two documents that differ only in member order and
// insignificant whitespace have the same canonical form; a changed value
// changes it.
//
// It returns an error for what is not one JSON value, and for an object
// that names a member twice (whose meaning JSON leaves open).
func CanonicalJSON(doc []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var out bytes.Buffer
	out.Grow(len(doc))
	if err := canonValue(dec, &out, 0); err != nil {
		return nil, fmt.Errorf("dedupe: canonical JSON: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("dedupe: canonical JSON: more after the value")
	}
	return out.Bytes(), nil
}

// maxDepth bounds the nesting CanonicalJSON follows.
const maxDepth = 1000

// canonValue writes the next value of dec. Strings and numbers are copied
// from the input as given, through the decoder's raw messages.
func canonValue(dec *json.Decoder, out *bytes.Buffer, depth int) error {
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return err
	}
	return canonRaw(raw, out, depth)
}

// canonRaw writes the canonical form of one raw JSON value.
func canonRaw(raw json.RawMessage, out *bytes.Buffer, depth int) error {
	if depth > maxDepth {
		return errors.New("nested too deep")
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return errors.New("empty value")
	}
	switch raw[0] {
	case '{':
		var members map[string]json.RawMessage
		if err := checkUniqueKeys(raw); err != nil {
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
			if err := canonRaw(members[k], out, depth+1); err != nil {
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
			if err := canonRaw(it, out, depth+1); err != nil {
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

// checkUniqueKeys returns an error when the object raw names a member
// twice (json.Unmarshal would keep the last silently).
func checkUniqueKeys(raw json.RawMessage) error {
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
