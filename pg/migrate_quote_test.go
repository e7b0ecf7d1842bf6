package pg

import (
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// commentText keeps a -- comment one line of printable text whatever the
// name, even one that the checks before it would have refused: no
// character ends the comment or hides in it.
func TestCommentTextStaysAComment(t *testing.T) {
	t.Parallel()
	names := []string{"kafka:offsets", "名前", `quote"s and \back`, "x\ny", "x\r\nDROP TABLE t; --", "x\u2028y", "x\u0085y", "\x00", "\xff\xfe", "a\u202eb", "tab\there"}
	for r := rune(0); r < 0x3100; r++ {
		names = append(names, "x"+string(r)+"DROP TABLE t;")
	}
	for _, name := range names {
		got := commentText(name)
		if !utf8.ValidString(got) {
			t.Fatalf("commentText(%q) = %q, not valid UTF-8", name, got)
		}
		for _, r := range got {
			if !unicode.IsPrint(r) {
				t.Fatalf("commentText(%q) = %q, holding %U", name, got, r)
			}
		}
		if printable(name) == nil && got != name {
			t.Fatalf("commentText(%q) = %q, want a printable name as it is", name, got)
		}
	}
}

func TestQuoteLiteral(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"idset:processed": `'idset:processed'`,
		"it's":            `'it''s'`,
		`back\slash`:      `E'back\\slash'`,
		`x\'); DROP`:      `E'x\\''); DROP'`,
		"":                `''`,
	} {
		if got := quoteLiteral(in); got != want {
			t.Errorf("quoteLiteral(%q) = %s, want %s", in, got, want)
		}
		if strings.Count(quoteLiteral(in), "\n") != strings.Count(in, "\n") {
			t.Errorf("quoteLiteral(%q) changed the lines", in)
		}
	}
}
