package parked

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// How a parked message is stored losslessly in text and JSON columns.

type headerJSON struct {
	Key string `json:"key"`
	// KeyBase64 is the exact key when it is not valid text (Key is then a
	// quoted rendering).
	KeyBase64   string `json:"key_base64,omitempty"`
	Value       string `json:"value,omitempty"`
	ValueBase64 string `json:"value_base64,omitempty"`
	// Null is true for a nil value, as opposed to an empty one.
	Null bool `json:"null,omitempty"`
}

// encodeHeaders renders headers as JSON for the parked table: keys and
// values that are valid text are kept as text, others in base64, and nil
// values are told from empty ones, so nothing is lost.
func encodeHeaders(hs []Header) string {
	out := make([]headerJSON, 0, len(hs))
	for _, h := range hs {
		var j headerJSON
		var exact bool
		j.Key, exact = renderText(h.Key)
		if !exact {
			j.KeyBase64 = base64.StdEncoding.EncodeToString([]byte(h.Key))
		}
		switch {
		case h.Value == nil:
			j.Null = true
		case isText(h.Value):
			j.Value = string(h.Value)
		default:
			j.ValueBase64 = base64.StdEncoding.EncodeToString(h.Value)
		}
		out = append(out, j)
	}
	b, _ := json.Marshal(out)
	return string(b)
}

// isText reports whether b can be stored in a text column as it is: valid
// UTF-8 without NUL bytes.
func isText(b []byte) bool {
	return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0
}

// renderText returns s when it can be stored in a text column as it is,
// and exact true; otherwise s quoted Go-style ("r\xff"), which is valid
// text and tells every byte.
func renderText(s string) (text string, exact bool) {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s, true
	}
	return strconv.Quote(s), false
}

// bytesIfInexact returns s's bytes when renderText cannot store it as it
// is, and nil otherwise.
func bytesIfInexact(s string) []byte {
	if _, exact := renderText(s); exact {
		return nil
	}
	return []byte(s)
}

// cleanText makes s storable in a text column: invalid UTF-8 and NUL bytes
// become U+FFFD. It is for messages meant to be read (errors), not for
// what must be kept exactly.
func cleanText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// messageHash identifies a parked message: scope, source, ref, key, payload
// and headers, each nil told from empty. The same delivery, or a
// redelivery of the same stored message, has the same hash; another message
// under the same ref has another. Lane, time, attempt and the dedupe key
// are left out: a redelivery may come through another lane (an SQS
// receiver), and the dedupe key follows from the rest. Unlike
// dedupe.Fingerprint, which hashes only the payload's bytes (so that a
// redelivery is a duplicate however a source reports an empty value), it
// tells a nil payload from an empty one: a tombstone and an empty message
// are two rows.
func messageHash(r *Row) []byte {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	str := func(s string) {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	opt := func(b []byte) {
		if b == nil {
			h.Write([]byte{0})
			return
		}
		h.Write([]byte{1})
		str(string(b))
	}
	str("effectively.parked/1")
	str(r.Scope)
	str(r.Source)
	str(r.Ref)
	opt(r.MsgKey)
	opt(r.Payload)
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(r.Headers)))])
	for _, hd := range r.Headers {
		str(hd.Key)
		opt(hd.Value)
	}
	return h.Sum(nil)
}

// headersFromJSON reverses encodeHeaders.
func headersFromJSON(raw []byte) ([]Header, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var js []headerJSON
	if err := json.Unmarshal(raw, &js); err != nil {
		return nil, fmt.Errorf("headers: %w", err)
	}
	if len(js) == 0 {
		return nil, nil
	}
	out := make([]Header, len(js))
	for i, j := range js {
		out[i].Key = j.Key
		if j.KeyBase64 != "" {
			k, err := base64.StdEncoding.DecodeString(j.KeyBase64)
			if err != nil {
				return nil, fmt.Errorf("header %q: key: %w", j.Key, err)
			}
			out[i].Key = string(k)
		}
		switch {
		case j.Null:
			out[i].Value = nil
		case j.ValueBase64 != "":
			v, err := base64.StdEncoding.DecodeString(j.ValueBase64)
			if err != nil {
				return nil, fmt.Errorf("header %q: %w", j.Key, err)
			}
			out[i].Value = v
		default:
			out[i].Value = []byte(j.Value)
		}
	}
	return out, nil
}
