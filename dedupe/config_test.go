package dedupe_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/dedupe"
)

func TestValidateIdentifier(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", dedupe.MaxIdentifierLen)
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
	} {
		err := dedupe.ValidateIdentifier(tc.name, tc.reserve)
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
	err := error(dedupe.ConfigErrorf("idset", "Table", "must not be empty"))
	if got, want := err.Error(), "idset: invalid config: Table: must not be empty"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(err, dedupe.ErrInvalidConfig) {
		t.Errorf("%v does not match ErrInvalidConfig", err)
	}
	if errors.Is(&dedupe.KeyError{}, dedupe.ErrInvalidConfig) {
		t.Error("a KeyError matches ErrInvalidConfig")
	}
}
