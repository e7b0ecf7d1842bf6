package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestAPIDiff runs the check on the fixture repository: it passes with
// no tag, saying so; it passes on a compatible change since the tag; and
// it fails on a changed exported signature, naming it, in the core and
// in a module of a subdirectory.
func TestAPIDiff(t *testing.T) {
	t.Setenv("GOPROXY", "off")
	root := t.TempDir()
	writeTree(t, root, fixture)
	writeTree(t, root, map[string]string{
		"internal/in/in.go": "package in\n\nfunc F() {}\n",
	})
	gitCommit(t, root, "fixture")
	// The check is run from the release module with a relative root.
	t.Chdir(root)
	root = "."

	check := func(wantIncompatible int, want ...string) {
		t.Helper()
		var out bytes.Buffer
		n, err := apiDiff(root, &out)
		if err != nil {
			t.Fatalf("apiDiff: %v\n%s", err, out.String())
		}
		if n != wantIncompatible {
			t.Errorf("%d incompatible changes, want %d:\n%s", n, wantIncompatible, out.String())
		}
		for _, w := range want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("output lacks %q:\n%s", w, out.String())
			}
		}
	}

	check(0, "example.com/core: no tag v* yet", "example.com/core/lib: no tag lib/v* yet")

	run(t, root, nil, "git", "tag", "v0.1.0")
	run(t, root, nil, "git", "tag", "lib/v0.1.0")
	run(t, root, nil, "git", "tag", "v0.1.0-rc.1")
	check(0, "example.com/core against v0.1.0: 0 incompatible, 0 compatible",
		"example.com/core/lib against lib/v0.1.0: 0 incompatible",
		"example.com/core/cmd/hello: no tag cmd/hello/v* yet")

	// Additions, and changes to internal packages, are compatible.
	writeTree(t, root, map[string]string{
		"more.go":           "package core\n\n// Farewell is new.\nfunc Farewell() string { return \"bye\" }\n",
		"internal/in/in.go": "package in\n\nfunc F(int) {}\n",
	})
	check(0, "example.com/core against v0.1.0: 0 incompatible, 1 compatible")

	// A changed signature in the core is not.
	writeTree(t, root, map[string]string{
		"core.go":    "package core\n\n// Greeting is what hello prints.\nfunc Greeting(name string) string { return \"hello \" + name }\n",
		"lib/lib.go": "package lib\n\nimport \"example.com/core\"\n\n// Line is the greeting with a newline.\nfunc Line() string { return core.Greeting(\"\") + \"\\n\" }\n",
	})
	check(1, "Greeting: changed from func() string to func(string) string")

	// Nor is a removal from a module in a subdirectory, checked against
	// its own tag.
	writeTree(t, root, map[string]string{
		"lib/lib.go": "package lib\n",
	})
	check(2, "example.com/core/lib against lib/v0.1.0: 1 incompatible", "Line: removed")
}
