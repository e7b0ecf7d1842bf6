package dedupe

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// MaxJSONDepth is the deepest nesting of arrays and objects CanonicalJSON
// accepts: a value inside 64 arrays and objects is accepted, one inside 65
// is an error. Real payloads nest a handful of levels; the limit keeps the
// cost of a hostile body in proportion to its size.
const MaxJSONDepth = 64

// Errors CanonicalJSON wraps, besides the syntax errors of what is not
// JSON.
var (
	// errJSONTooDeep: the document nests arrays and objects deeper than
	// MaxJSONDepth.
	errJSONTooDeep = errors.New("nested too deep")
	// errJSONDuplicate: an object names a member twice.
	errJSONDuplicate = errors.New("member named twice")
	// errJSONTooLarge: the document or its canonical form is over 2 GiB,
	// past what the member offsets hold.
	errJSONTooLarge = fmt.Errorf("document or canonical form over %d bytes", math.MaxInt32)
)

// CanonicalJSON returns doc in a canonical form, for fingerprints that a
// producer's re-serialization does not change: object members sorted by
// key (byte order of the decoded key, written as encoding/json writes it),
// no whitespace between tokens, and every number and string value exactly
// as given (1.0 stays 1.0, "\u00e9" stays escaped). Two documents that
// differ only in member order and insignificant whitespace have the same
// canonical form; a changed value changes it.
//
// It returns an error for what is not one JSON value (as encoding/json's
// Valid decides), for an object that names a member twice (whose meaning
// JSON leaves open), for arrays and objects nested deeper than
// MaxJSONDepth, and for a document (or canonical form) over 2 GiB.
//
// Its cost is bounded by the size of doc, whatever the shape: one pass
// over the bytes; each object's members are sorted once (O(k log k) for k
// members), and the bytes of an object whose members were out of order are
// moved once more, so no byte moves more than MaxJSONDepth times. It
// allocates the output and a few working buffers, each about the size of
// doc.
func CanonicalJSON(doc []byte) ([]byte, error) {
	if len(doc) > math.MaxInt32 {
		return nil, fmt.Errorf("dedupe: canonical JSON: %w", errJSONTooLarge)
	}
	c := canonicalizer{in: doc, out: make([]byte, 0, len(doc))}
	c.skipSpace()
	if err := c.value(); err != nil {
		return nil, fmt.Errorf("dedupe: canonical JSON: %w", err)
	}
	c.skipSpace()
	if c.pos < len(c.in) {
		return nil, fmt.Errorf("dedupe: canonical JSON: more after the value, at offset %d", c.pos)
	}
	return c.out, nil
}

// canonicalizer reads one JSON document and writes its canonical form in
// the same pass. Objects are written as they come; an object whose members
// came out of order is rewritten in sorted order when it closes, from the
// member spans recorded on the members stack.
type canonicalizer struct {
	in      []byte
	pos     int    // next byte of in to read
	out     []byte // the canonical form so far
	depth   int    // arrays and objects open
	members []member
	keys    []byte // decoded keys that differ from their bytes in in
	scratch []byte // an object's members while they are reordered
}

// member is one member of an object still open: its decoded key and where
// the member ("key":value, in canonical form) stands in out. koff >= 0
// places the key in in, koff < 0 at -koff-1 in keys.
type member struct {
	koff, klen int32
	start, end int32
}

func (c *canonicalizer) key(m member) []byte {
	if m.koff >= 0 {
		return c.in[m.koff : m.koff+m.klen]
	}
	o := -m.koff - 1
	return c.keys[o : o+m.klen]
}

func (c *canonicalizer) skipSpace() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

// syntax is the error for the byte at pos, or for the end of the input.
func (c *canonicalizer) syntax(context string) error {
	if c.pos >= len(c.in) {
		return fmt.Errorf("unexpected end of JSON input %s", context)
	}
	return fmt.Errorf("invalid character %s %s, at offset %d", quoteChar(c.in[c.pos]), context, c.pos)
}

func quoteChar(b byte) string {
	switch {
	case b == '\'':
		return `'\''`
	case b == '"':
		return `'"'`
	case b < 0x20 || b >= 0x7f:
		return fmt.Sprintf("0x%02x", b)
	}
	return "'" + string(b) + "'"
}

// value reads the value at pos and writes its canonical form.
func (c *canonicalizer) value() error {
	if c.pos >= len(c.in) {
		return c.syntax("looking for the beginning of a value")
	}
	start := c.pos
	switch b := c.in[c.pos]; {
	case b == '{':
		return c.object()
	case b == '[':
		return c.array()
	case b == '"':
		if _, err := c.str(); err != nil {
			return err
		}
	case b == '-' || '0' <= b && b <= '9':
		if err := c.number(); err != nil {
			return err
		}
	case b == 't':
		if err := c.literal("true"); err != nil {
			return err
		}
	case b == 'f':
		if err := c.literal("false"); err != nil {
			return err
		}
	case b == 'n':
		if err := c.literal("null"); err != nil {
			return err
		}
	default:
		return c.syntax("looking for the beginning of a value")
	}
	// A string, number, true, false or null: as given.
	c.out = append(c.out, c.in[start:c.pos]...)
	return nil
}

func (c *canonicalizer) literal(lit string) error {
	for i := 0; i < len(lit); i++ {
		if c.pos >= len(c.in) || c.in[c.pos] != lit[i] {
			return c.syntax("in literal " + lit)
		}
		c.pos++
	}
	return nil
}

// number reads a number as JSON's grammar has it:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (c *canonicalizer) number() error {
	if c.in[c.pos] == '-' {
		c.pos++
	}
	switch {
	case c.pos < len(c.in) && c.in[c.pos] == '0':
		c.pos++
	case c.pos < len(c.in) && '1' <= c.in[c.pos] && c.in[c.pos] <= '9':
		c.digits()
	default:
		return c.syntax("in numeric literal")
	}
	if c.pos < len(c.in) && c.in[c.pos] == '.' {
		c.pos++
		if c.digits() == 0 {
			return c.syntax("after decimal point in numeric literal")
		}
	}
	if c.pos < len(c.in) && (c.in[c.pos] == 'e' || c.in[c.pos] == 'E') {
		c.pos++
		if c.pos < len(c.in) && (c.in[c.pos] == '+' || c.in[c.pos] == '-') {
			c.pos++
		}
		if c.digits() == 0 {
			return c.syntax("in exponent of numeric literal")
		}
	}
	return nil
}

func (c *canonicalizer) digits() int {
	n := 0
	for c.pos < len(c.in) && '0' <= c.in[c.pos] && c.in[c.pos] <= '9' {
		c.pos++
		n++
	}
	return n
}

// open counts one more array or object open, refusing one too many.
func (c *canonicalizer) open() error {
	c.depth++
	if c.depth > MaxJSONDepth {
		return fmt.Errorf("%w: more than %d arrays and objects inside one another, at offset %d", errJSONTooDeep, MaxJSONDepth, c.pos)
	}
	return nil
}

func (c *canonicalizer) array() error {
	if err := c.open(); err != nil {
		return err
	}
	c.pos++
	c.out = append(c.out, '[')
	c.skipSpace()
	if c.pos < len(c.in) && c.in[c.pos] == ']' {
		c.pos++
		c.out = append(c.out, ']')
		c.depth--
		return nil
	}
	for {
		c.skipSpace()
		if err := c.value(); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.in) {
			return c.syntax("after array element")
		}
		switch c.in[c.pos] {
		case ',':
			c.pos++
			c.out = append(c.out, ',')
		case ']':
			c.pos++
			c.out = append(c.out, ']')
			c.depth--
			return nil
		default:
			return c.syntax("after array element")
		}
	}
}

func (c *canonicalizer) object() error {
	if err := c.open(); err != nil {
		return err
	}
	c.pos++
	c.out = append(c.out, '{')
	c.skipSpace()
	if c.pos < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
		c.out = append(c.out, '}')
		c.depth--
		return nil
	}
	base, keyMark, body := len(c.members), len(c.keys), len(c.out)
	sorted := true
	for {
		c.skipSpace()
		if c.pos >= len(c.in) || c.in[c.pos] != '"' {
			return c.syntax("looking for the beginning of an object key string")
		}
		m := member{start: int32(len(c.out))}
		if err := c.memberKey(&m); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.in) || c.in[c.pos] != ':' {
			return c.syntax("after object key")
		}
		c.pos++
		c.out = append(c.out, ':')
		c.skipSpace()
		if err := c.value(); err != nil {
			return err
		}
		if len(c.out) > math.MaxInt32 {
			return errJSONTooLarge
		}
		m.end = int32(len(c.out))
		if n := len(c.members); n > base {
			switch bytes.Compare(c.key(c.members[n-1]), c.key(m)) {
			case 0:
				return c.duplicate(m)
			case 1:
				sorted = false
			}
		}
		if len(c.members) == cap(c.members) {
			// Doubling, not append's slower growth for large slices: the
			// copies of an object of many members then add up to at most
			// the stack's final size.
			c.members = slices.Grow(c.members, max(len(c.members), 64))
		}
		c.members = append(c.members, m)
		c.skipSpace()
		if c.pos >= len(c.in) {
			return c.syntax("after object key:value pair")
		}
		if c.in[c.pos] == '}' {
			break
		}
		if c.in[c.pos] != ',' {
			return c.syntax("after object key:value pair")
		}
		c.pos++
		c.out = append(c.out, ',')
	}
	if ms := c.members[base:]; !sorted {
		slices.SortFunc(ms, func(a, b member) int { return bytes.Compare(c.key(a), c.key(b)) })
		for i := 1; i < len(ms); i++ {
			if bytes.Equal(c.key(ms[i-1]), c.key(ms[i])) {
				return c.duplicate(ms[i])
			}
		}
		c.scratch = append(c.scratch[:0], c.out[body:]...)
		c.out = c.out[:body]
		for i, m := range ms {
			if i > 0 {
				c.out = append(c.out, ',')
			}
			c.out = append(c.out, c.scratch[int(m.start)-body:int(m.end)-body]...)
		}
	}
	c.pos++
	c.out = append(c.out, '}')
	c.members = c.members[:base]
	c.keys = c.keys[:keyMark]
	c.depth--
	return nil
}

func (c *canonicalizer) duplicate(m member) error {
	return fmt.Errorf("%w: %q, in the object before offset %d", errJSONDuplicate, strings.ToValidUTF8(string(c.key(m)), "\uFFFD"), c.pos)
}
