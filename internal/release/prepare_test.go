package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixture is a small repository shaped like this one: a core, a library
// module and a command module that replace it with the tree, and an
// example that is never released.
var fixture = map[string]string{
	"go.work": "go 1.26.0\n\nuse (\n\t.\n\t./lib\n\t./cmd/hello\n\t./examples/ex\n)\n",
	"go.mod":  "module example.com/core\n\ngo 1.26.0\n",
	"core.go": "package core\n\n// Greeting is what hello prints.\nfunc Greeting() string { return \"hello\" }\n",
	"lib/go.mod": "module example.com/core/lib\n\ngo 1.26.0\n\n" +
		"require example.com/core v0.0.0-00010101000000-000000000000\n\n" +
		"// The core, from this tree.\nreplace example.com/core => ../\n",
	"lib/lib.go": "package lib\n\nimport \"example.com/core\"\n\n// Line is the greeting with a newline.\nfunc Line() string { return core.Greeting() + \"\\n\" }\n",
	"cmd/hello/go.mod": "module example.com/core/cmd/hello\n\ngo 1.26.0\n\n" +
		"require example.com/core/lib v0.0.0-00010101000000-000000000000\n\n" +
		"require example.com/core v0.0.0-00010101000000-000000000000 // indirect\n\n" +
		"replace (\n\texample.com/core => ../..\n\texample.com/core/lib => ../../lib\n)\n",
	"cmd/hello/main.go": "package main\n\nimport (\n\t\"os\"\n\n\t\"example.com/core/lib\"\n)\n\nfunc main() { os.Stdout.WriteString(lib.Line()) }\n",
	"examples/ex/go.mod": "module example.com/core/examples/ex\n\ngo 1.26.0\n\n" +
		"require example.com/core v0.0.0-00010101000000-000000000000\n\nreplace example.com/core => ../..\n",
	"examples/ex/main.go": "package main\n\nimport \"example.com/core\"\n\nfunc main() { println(core.Greeting()) }\n",
}

func TestPrepareRewritesRequirements(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, fixture)
	gitCommit(t, root, "fixture")
	if _, err := prepare(root, "v0.3.0"); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, name := range []string{"lib/go.mod", "cmd/hello/go.mod"} {
		gomod := read(name)
		if strings.Contains(gomod, "replace") || strings.Contains(gomod, "v0.0.0-00010101000000-000000000000") {
			t.Errorf("%s still names the tree:\n%s", name, gomod)
		}
		if !strings.Contains(gomod, "example.com/core v0.3.0") {
			t.Errorf("%s does not require the core at v0.3.0:\n%s", name, gomod)
		}
	}
	if gomod := read("cmd/hello/go.mod"); !strings.Contains(gomod, "example.com/core v0.3.0 // indirect") ||
		!strings.Contains(gomod, "example.com/core/lib v0.3.0\n") {
		t.Errorf("cmd/hello/go.mod:\n%s", gomod)
	}
	if got := read("examples/ex/go.mod"); got != fixture["examples/ex/go.mod"] {
		t.Errorf("the example's go.mod changed:\n%s", got)
	}
	sum := read("cmd/hello/go.sum")
	for _, want := range []string{"example.com/core v0.3.0 h1:", "example.com/core v0.3.0/go.mod h1:", "example.com/core/lib v0.3.0 h1:", "example.com/core/lib v0.3.0/go.mod h1:"} {
		if !strings.Contains(sum, want) {
			t.Errorf("cmd/hello/go.sum lacks %q:\n%s", want, sum)
		}
	}
}

func TestPrepareRefusesABadVersion(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, fixture)
	gitCommit(t, root, "fixture")
	for _, v := range []string{"0.1.0", "v0.1", "v2.0.0", "v1.0.0+meta"} {
		if _, err := prepare(root, v); err == nil {
			t.Errorf("prepare %s: no error", v)
		}
	}
}

// TestPreparedFixtureInstalls is the hermetic half of the proof: after
// prepare, the fixture's modules are tidy, their go.sum hashes are what
// the go command computes from the proxy's zips, and go install at the
// version works with no workspace.
func TestPreparedFixtureInstalls(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, fixture)
	gitCommit(t, root, "fixture")
	const v = "v0.3.0"
	if _, err := prepare(root, v); err != nil {
		t.Fatal(err)
	}
	gitCommit(t, root, "release "+v)
	proxy := t.TempDir()
	if err := buildProxy(root, v, proxy); err != nil {
		t.Fatal(err)
	}
	env := goEnv(t, proxy)
	for _, dir := range []string{"lib", "cmd/hello"} {
		run(t, filepath.Join(root, dir), env, "go", "mod", "tidy", "-diff")
		run(t, filepath.Join(root, dir), env, "go", "build", "-mod=readonly", "./...")
	}
	run(t, t.TempDir(), env, "go", "install", "example.com/core/cmd/hello@"+v)
	bin := filepath.Join(envValue(env, "GOBIN"), "hello")
	if out := run(t, ".", nil, bin); out != "hello\n" {
		t.Errorf("hello printed %q", out)
	}
}

// TestTamperedSumFails shows the check above can fail: a go.sum hash that
// is not the proxy's is refused.
func TestTamperedSumFails(t *testing.T) {
	root := t.TempDir()
	writeTree(t, root, fixture)
	gitCommit(t, root, "fixture")
	const v = "v0.3.0"
	if _, err := prepare(root, v); err != nil {
		t.Fatal(err)
	}
	proxy := t.TempDir()
	if err := buildProxy(root, v, proxy); err != nil {
		t.Fatal(err)
	}
	// The core changes after its hash went into lib's go.sum.
	writeTree(t, root, map[string]string{"core.go": fixture["core.go"] + "\n// Changed.\n"})
	gitCommit(t, root, "late change")
	if err := buildProxy(root, v, proxy); err != nil {
		t.Fatal(err)
	}
	out, err := runErr(filepath.Join(root, "lib"), goEnv(t, proxy), "go", "build", "-mod=readonly", "./...")
	if err == nil || !strings.Contains(out, "checksum mismatch") {
		t.Fatalf("go build with a stale go.sum: err %v, output:\n%s", err, out)
	}
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// TestReleased: the modules under examples/, bench/, integration/ and
// internal/ are never tagged; every other module of the workspace is.
func TestReleased(t *testing.T) {
	for dir, want := range map[string]bool{
		".":                   true,
		"cli":                 true,
		"cmd/effectively":     true,
		"sources/franz":       true,
		"outbox/franzsink":    true,
		"examples":            false,
		"examples/metrics":    false,
		"bench":               false,
		"internal/chaos":      false,
		"integration":         false,
		"sources/x/internal":  false,
		"benchmarks":          true,
		"examplesque/library": true,
	} {
		if got := released(dir); got != want {
			t.Errorf("released(%q) = %v, want %v", dir, got, want)
		}
	}
}
