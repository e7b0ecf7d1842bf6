package pg_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
)

func TestValidateIdentifier(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", pg.MaxIdentifierLen)
	for _, tc := range []struct {
		name    string
		reserve int
		want    string // a part of the error, "" for none
	}{
		{"effectively", 0, ""},
		{`Mixed "quoted" name; DROP TABLE x`, 0, ""}, // quoted when used
		{"名前", 0, ""},
		{long, 0, ""},
		{long[:47], 16, ""},
		{"", 0, "must not be empty"},
		{long + "x", 0, "64 bytes long, over PostgreSQL's limit of 63"},
		{long[:48], 16, "48 bytes long, over the limit of 47 (PostgreSQL's 63, less 16"},
		{"a\xffb", 0, "not valid UTF-8"},
		{"a\x00b", 0, "contains a NUL byte"},
		{"Zürich orders", 0, ""},                       // spaces and letters of any script
		{"orders-2026.v2 (old)", 0, ""},                // punctuation
		{"parked\nDROP TABLE orders; --", 0, `U+000A`}, // a newline would end a -- comment
		{"parked\r", 0, "U+000D"},                      // so would a carriage return
		{"a\tb", 0, "U+0009, a control character"},     // tab
		{"a\x1bb", 0, "U+001B, a control character"},   // escape, the start of terminal sequences
		{"a\x7fb", 0, "U+007F, a control character"},   // DEL
		{"a\u0085b", 0, "U+0085, a control character"}, // NEL, a C1 control
		{"a\u2028b", 0, "U+2028, not a printable"},     // line separator
		{"a\u202eb", 0, "U+202E, not a printable"},     // right-to-left override
		{"a\u200bb", 0, "U+200B, not a printable"},     // zero-width space
		{"a\u00a0b", 0, "U+00A0, not a printable"},     // no-break space: looks like a space, is not one
		{long + "\n", 0, "64 bytes long"},              // the length is checked first
		{"名前" + long[:58], 0, "64 bytes long"},         // bytes, not characters
	} {
		err := pg.ValidateIdentifier(tc.name, tc.reserve)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("ValidateIdentifier(%q, %d) = %v, want nil", tc.name, tc.reserve, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("ValidateIdentifier(%q, %d) = %v, want an error containing %q", tc.name, tc.reserve, err, tc.want)
		}
	}
}

func TestConfigError(t *testing.T) {
	t.Parallel()
	err := error(pg.ConfigErrorf("idset", "Table", "must not be empty"))
	if got, want := err.Error(), "idset: invalid config: Table: must not be empty"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(err, pg.ErrInvalidConfig) {
		t.Errorf("%v does not match ErrInvalidConfig", err)
	}
	if errors.Is(&dedupe.KeyError{}, pg.ErrInvalidConfig) {
		t.Error("a KeyError matches ErrInvalidConfig")
	}
}
