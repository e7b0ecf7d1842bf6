package readme

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// root is the repository's root, relative to this package's directory.
const root = "../.."

// marker names the file a Go block mirrors: <!-- examples/readme/ledger/x.go -->.
var marker = regexp.MustCompile(`^<!--\s*(examples/readme/\S+\.go)\s*-->$`)

// block is one ```go block of a Markdown file.
type block struct {
	line int    // of the opening fence, from 1
	file string // the file named by the marker before it, or ""
	code string
}

// goBlocks returns the ```go blocks of md, with the file each one's marker
// names, or an error for a block left open.
func goBlocks(md string) ([]block, error) {
	lines := strings.Split(md, "\n")
	var out []block
	for i := 0; i < len(lines); i++ {
		fence := strings.TrimRight(lines[i], " \t\r")
		if !strings.HasPrefix(fence, "```") {
			continue
		}
		lang := strings.TrimSpace(strings.TrimPrefix(fence, "```"))
		start := i
		for i++; i < len(lines) && strings.TrimRight(lines[i], " \t\r") != "```"; i++ {
		}
		if i == len(lines) {
			return nil, fmt.Errorf("line %d: code block is never closed", start+1)
		}
		if lang != "go" {
			continue
		}
		b := block{line: start + 1, code: strings.Join(lines[start+1:i], "\n")}
		if start > 0 {
			if m := marker.FindStringSubmatch(strings.TrimSpace(lines[start-1])); m != nil {
				b.file = m[1]
			}
		}
		out = append(out, b)
	}
	return out, nil
}

// check returns one error for each Go block of md that names no file, names
// a file that readFile cannot read, or differs from its file; and an error
// if md has no Go block at all.
func check(md string, readFile func(name string) ([]byte, error)) []error {
	blocks, err := goBlocks(md)
	if err != nil {
		return []error{err}
	}
	if len(blocks) == 0 {
		return []error{errors.New("no ```go block found")}
	}
	var errs []error
	for _, b := range blocks {
		if b.file == "" {
			errs = append(errs, fmt.Errorf("line %d: ```go block without a <!-- examples/readme/….go --> line before it naming the file it mirrors", b.line))
			continue
		}
		want, err := readFile(b.file)
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %w", b.line, err))
			continue
		}
		if d := diff(strings.TrimSpace(string(want)), strings.TrimSpace(b.code)); d != "" {
			errs = append(errs, fmt.Errorf("line %d: the block differs from %s: %s", b.line, b.file, d))
		}
	}
	return errs
}

// diff describes the first line where file and readme differ, or returns "".
func diff(file, readme string) string {
	if file == readme {
		return ""
	}
	f, r := strings.Split(file, "\n"), strings.Split(readme, "\n")
	for i := 0; i < max(len(f), len(r)); i++ {
		var fl, rl string
		if i < len(f) {
			fl = f[i]
		}
		if i < len(r) {
			rl = r[i]
		}
		if fl != rl || i >= len(f) || i >= len(r) {
			return fmt.Sprintf("at its line %d, the file has %q and README.md %q", i+1, fl, rl)
		}
	}
	return "they differ in invisible bytes"
}

func readRepoFile(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
}

func TestREADMEMirrorsExamples(t *testing.T) {
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range check(string(md), readRepoFile) {
		t.Error(err)
	}
	if t.Failed() {
		t.Log("README.md's Go blocks must be copies of the files they name (see examples/readme/doc.go)")
	}
}

// Every non-test Go file of the ledger package is shown in README.md, so no
// part of the example goes unexplained.
func TestREADMEShowsEveryLedgerFile(t *testing.T) {
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := goBlocks(string(md))
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	for _, b := range blocks {
		shown[b.file] = true
	}
	files, err := fs.Glob(os.DirFS(root), "examples/readme/ledger/*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") && !shown[f] {
			t.Errorf("%s is not shown in README.md", f)
		}
	}
}

// The check fails when a block and its file drift apart, or when a block
// does not say which file it mirrors. It runs over a README made in memory
// from the ledger's files, altered one way at a time.
func TestCheckCatchesDrift(t *testing.T) {
	var b strings.Builder
	b.WriteString("# ledger\n\nSome prose.\n\n```sh\ngo get example.com/x\n```\n")
	for _, name := range []string{"examples/readme/ledger/ledger.go", "examples/readme/ledger/kafka.go"} {
		code, err := readRepoFile(name)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "\n<!-- %s -->\n```go\n%s```\n\nMore prose.\n", name, code)
	}
	readme := b.String()
	if errs := check(readme, readRepoFile); len(errs) > 0 {
		t.Fatalf("the unaltered copy fails the check: %v", errs)
	}
	cases := []struct {
		name, readme string
		want         string // in the single error expected
	}{
		{"a changed line", strings.Replace(readme, `consumer.JSONField("transfer_id")`, `consumer.JSONField("event_id")`, 1), "differs from examples/readme/ledger/ledger.go: at its line"},
		{"a changed comment", strings.Replace(readme, "// also the dedupe scope", "// the dedupe scope", 1), "differs from examples/readme/ledger/ledger.go"},
		{"a line added", strings.Replace(readme, "\npackage ledger\n", "\npackage ledger\n\n// A comment only README.md has.\n", 1), "differs from examples/readme/ledger/ledger.go"},
		{"a line dropped", strings.Replace(readme, "\tdefer src.Close()\n", "", 1), "differs from examples/readme/ledger/kafka.go"},
		{"a trailing line added", strings.Replace(readme, "}\n```\n\nMore prose.\n", "}\n// and one more\n```\n\nMore prose.\n", 1), "differs from examples/readme/ledger/ledger.go"},
		{"a block without its marker", strings.Replace(readme, "<!-- examples/readme/ledger/kafka.go -->\n", "", 1), "without a <!-- examples/readme/"},
		{"a marker naming a missing file", strings.Replace(readme, "<!-- examples/readme/ledger/kafka.go -->", "<!-- examples/readme/ledger/gone.go -->", 1), "gone.go"},
		{"a new Go block", readme + "\n```go\nfmt.Println(\"hi\")\n```\n", "without a <!-- examples/readme/"},
		{"a block left open", readme + "\n```go\nfmt.Println(\"hi\")\n", "never closed"},
		{"no Go block", "# nothing\n", "no ```go block"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.readme == readme {
				t.Fatal("the alteration did not apply: update this test")
			}
			errs := check(tc.readme, readRepoFile)
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), tc.want) {
				t.Fatalf("check found %v, want one error containing %q", errs, tc.want)
			}
		})
	}
	t.Run("blank lines around a block", func(t *testing.T) {
		spaced := strings.ReplaceAll(readme, "```go\npackage ledger\n", "```go\n\npackage ledger\n")
		if errs := check(spaced, readRepoFile); len(errs) > 0 {
			t.Errorf("a blank line at a block's start counted as a difference: %v", errs)
		}
	})
}

func TestREADMEHasInstallLine(t *testing.T) {
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(md, []byte("go get github.com/effectively-once/effectively")) {
		t.Error("README.md has lost its install line")
	}
}
