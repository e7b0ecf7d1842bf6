// Package archcheck holds a test that keeps docs/architecture.md honest:
// every Go file it names must exist.
package archcheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// goFile is a file name in backquotes, with or without a directory.
var goFile = regexp.MustCompile("`([A-Za-z0-9_./-]+\\.go)`")

// TestArchitectureNamesExistingFiles fails when docs/architecture.md
// names a Go file that is gone: a path must exist as written (from the
// repository's root), and a bare name must be the name of some file of
// the tree.
func TestArchitectureNamesExistingFiles(t *testing.T) {
	root := filepath.Join("..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") {
			names[d.Name()] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, m := range goFile.FindAllStringSubmatch(string(doc), -1) {
		name := m[1]
		seen++
		if strings.Contains(name, "/") {
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(name))); err != nil {
				t.Errorf("docs/architecture.md names %s, which does not exist", name)
			}
			continue
		}
		if !names[name] {
			t.Errorf("docs/architecture.md names %s, and no file of the tree has that name", name)
		}
	}
	if seen < 20 {
		t.Fatalf("found only %d Go files named in docs/architecture.md; is the pattern right?", seen)
	}
}
