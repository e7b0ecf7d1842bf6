package dedupe

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxIdentifierLen is PostgreSQL's limit on the length of an identifier, in
// bytes (NAMEDATALEN - 1). The server silently truncates a longer name, so
// two long names could end up naming the same table or index.
const MaxIdentifierLen = 63

// ValidateIdentifier checks a schema, table or other name taken from
// configuration. The name must not be empty, must be valid UTF-8 without
// NUL bytes (PostgreSQL cannot store either), and must be at most
// MaxIdentifierLen-reserve bytes long, reserve being the room kept for the
// longest suffix the caller appends to the name to make others (index or
// partition names). Any other character is allowed: the library quotes
// every identifier with pgx.Identifier.Sanitize. The error says which check
// failed; it is meant to be the Reason of a ConfigError.
func ValidateIdentifier(name string, reserve int) error {
	limit := MaxIdentifierLen - reserve
	switch {
	case name == "":
		return fmt.Errorf("must not be empty")
	case len(name) > limit && reserve > 0:
		return fmt.Errorf("%q is %d bytes long, over the limit of %d (PostgreSQL's %d, less %d for the suffixes appended to it)",
			name, len(name), limit, MaxIdentifierLen, reserve)
	case len(name) > limit:
		return fmt.Errorf("%q is %d bytes long, over PostgreSQL's limit of %d for identifiers", name, len(name), limit)
	case !utf8.ValidString(name):
		return fmt.Errorf("%q is not valid UTF-8", name)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("%q contains a NUL byte", name)
	}
	return nil
}
