package dedupe

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// What a string's bytes hold, for the fast path of keys.
const (
	strEscape   = 1 << iota // a backslash escape
	strHTML                 // <, > or &, which encoding/json escapes
	strNonASCII             // a byte of 0x80 or more
)

// plainStringByte holds true for the bytes a string holds that need no
// attention: printable ASCII but ", \, <, > and &.
var plainStringByte = func() (t [256]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = !strings.ContainsRune(`"\<>&`, rune(b))
	}
	return t
}()

// str reads the string at pos (its opening quote), checking it as
// encoding/json does, and says what it holds.
func (c *canonicalizer) str() (flags int, err error) {
	c.pos++
	for c.pos < len(c.in) {
		if plainStringByte[c.in[c.pos]] {
			c.pos++
			continue
		}
		switch b := c.in[c.pos]; {
		case b == '"':
			c.pos++
			return flags, nil
		case b == '\\':
			flags |= strEscape
			c.pos++
			if c.pos >= len(c.in) {
				return 0, c.syntax("in string escape code")
			}
			switch c.in[c.pos] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				c.pos++
			case 'u':
				c.pos++
				for range 4 {
					if c.pos >= len(c.in) || hexValue(c.in[c.pos]) < 0 {
						return 0, c.syntax(`in \u hexadecimal character escape`)
					}
					c.pos++
				}
			default:
				return 0, c.syntax("in string escape code")
			}
		case b < 0x20:
			return 0, c.syntax("in string literal")
		case b == '<' || b == '>' || b == '&':
			flags |= strHTML
			c.pos++
		case b >= utf8.RuneSelf:
			flags |= strNonASCII
			c.pos++
		default:
			c.pos++
		}
	}
	return 0, c.syntax("in string literal")
}

// memberKey reads the key at pos, records its decoded form in m and writes
// it to out as encoding/json writes a string: a key whose bytes are already
// that form (the usual case) is copied and is its own decoded form; any
// other is decoded into keys and encoded again.
func (c *canonicalizer) memberKey(m *member) error {
	start := c.pos
	flags, err := c.str()
	if err != nil {
		return err
	}
	raw := c.in[start+1 : c.pos-1]
	if flags == 0 || flags == strNonASCII && plainUTF8(raw) {
		m.koff, m.klen = int32(start+1), int32(len(raw))
		c.out = append(c.out, c.in[start:c.pos]...)
		return nil
	}
	off := len(c.keys)
	c.keys = appendUnquoted(c.keys, raw)
	if len(c.keys) > math.MaxInt32 {
		return errJSONTooLarge
	}
	m.koff, m.klen = int32(-off-1), int32(len(c.keys)-off)
	// Only such a key can make the output longer than the input (up to six
	// times, an invalid byte or a < written as a \u escape); grow it by
	// doubling, so that the copies add up to at most its final size.
	if need := 6*len(raw) + 2; cap(c.out)-len(c.out) < need {
		c.out = slices.Grow(c.out, max(len(c.out), need))
	}
	c.out = appendQuoted(c.out, c.keys[off:])
	return nil
}

// plainUTF8 reports whether encoding/json writes s as it is: valid UTF-8
// without U+2028 or U+2029, which it escapes.
func plainUTF8(s []byte) bool {
	return utf8.Valid(s) && !bytes.Contains(s, []byte("\u2028")) && !bytes.Contains(s, []byte("\u2029"))
}

// appendUnquoted appends the decoded form of the string body s, checked by
// str, as encoding/json decodes it: an invalid UTF-8 byte or a lone
// surrogate escape becomes U+FFFD.
func appendUnquoted(dst, s []byte) []byte {
	for r := 0; r < len(s); {
		switch c := s[r]; {
		case c == '\\':
			switch s[r+1] {
			case 'b':
				dst = append(dst, '\b')
			case 'f':
				dst = append(dst, '\f')
			case 'n':
				dst = append(dst, '\n')
			case 'r':
				dst = append(dst, '\r')
			case 't':
				dst = append(dst, '\t')
			case 'u':
				rr := getu4(s[r:])
				r += 6
				if utf16.IsSurrogate(rr) {
					if dec := utf16.DecodeRune(rr, getu4(s[r:])); dec != unicode.ReplacementChar {
						r += 6
						dst = utf8.AppendRune(dst, dec)
						continue
					}
					rr = unicode.ReplacementChar
				}
				dst = utf8.AppendRune(dst, rr)
				continue
			default: // '"', '\\', '/'
				dst = append(dst, s[r+1])
			}
			r += 2
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			r++
		default:
			rr, size := utf8.DecodeRune(s[r:])
			r += size
			dst = utf8.AppendRune(dst, rr)
		}
	}
	return dst
}

// getu4 decodes the \uXXXX escape that s starts with, or returns -1.
func getu4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, b := range s[2:6] {
		v := hexValue(b)
		if v < 0 {
			return -1
		}
		r = r<<4 | rune(v)
	}
	return r
}

func hexValue(b byte) int {
	switch {
	case '0' <= b && b <= '9':
		return int(b - '0')
	case 'a' <= b && b <= 'f':
		return int(b - 'a' + 10)
	case 'A' <= b && b <= 'F':
		return int(b - 'A' + 10)
	}
	return -1
}

const lowerHex = "0123456789abcdef"

// appendQuoted appends s as a JSON string exactly as encoding/json's
// Marshal writes a Go string (HTML escaping on): ", \ and control
// characters escaped, <, > and & as \u003c, \u003e and \u0026, U+2028 and
// U+2029 escaped, an invalid UTF-8 byte as \ufffd.
func appendQuoted(dst, s []byte) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', lowerHex[b>>4], lowerHex[b&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', lowerHex[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
