package pg

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxIdentifierLen is PostgreSQL's limit on the length of an identifier, in
// bytes (NAMEDATALEN - 1). The server silently truncates a longer name, so
// two long names could end up naming the same table or index.
const MaxIdentifierLen = 63

// ValidateIdentifier checks a schema, table or other name taken from
// configuration. The rule:
//
//   - not empty;
//   - at most MaxIdentifierLen-reserve bytes long (bytes, not characters),
//     reserve being the room kept for the longest suffix the caller
//     appends to the name to make others (index or partition names);
//   - valid UTF-8;
//   - printable characters only, as unicode.IsPrint has it: letters,
//     marks, digits, punctuation and symbols of any script, and the ASCII
//     space. No NUL or other control character (tab, newline, carriage
//     return, escape, DEL, the C1 controls), and no other space or
//     invisible character (no-break space, line separator, zero-width and
//     bidirectional formatting characters).
//
// Within that rule any character is allowed, quotes and semicolons
// included: the library quotes every identifier with
// pgx.Identifier.Sanitize. Only printable names can be shown safely in a
// SQL comment, a log line or a terminal, and read back as what they are.
// The error says which check failed; it is meant to be the Reason of a
// ConfigError.
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
	}
	return printable(name)
}

// printable checks the characters of a name by ValidateIdentifier's rule,
// its length aside.
func printable(name string) error {
	switch {
	case !utf8.ValidString(name):
		return fmt.Errorf("%q is not valid UTF-8", name)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("%q contains a NUL byte", name)
	}
	for i, r := range name {
		switch {
		case unicode.IsControl(r):
			return fmt.Errorf("%q contains %U, a control character, at byte %d: identifiers hold printable characters only", name, r, i)
		case !unicode.IsPrint(r):
			return fmt.Errorf("%q contains %U, not a printable character, at byte %d: identifiers hold printable characters only", name, r, i)
		}
	}
	return nil
}
