package archcheck

import (
	"bufio"
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// module is the core module's path; every package of the workspace is
// under it.
const module = "github.com/effectively-once/effectively"

// layers ranks the top-level folders from the bottom up, as
// docs/architecture.md draws them: a package may import packages of its
// own folder and of folders ranked at or below its own, never above. The
// helpers under internal/ (logging, error classification, the test
// brokers) sit at the bottom with pg; what drives the whole library
// (benchmarks, examples, the integration suites, the commands) at the top.
var layers = map[string]int{
	"pg":          0,
	"internal":    0,
	"pgtest":      0,
	"dedupe":      1,
	"consumer":    2,
	"sources":     3,
	"idempotency": 4,
	"outbox":      4,
	"metrics":     5,
	"tracing":     5,
	"cli":         5,
	"cmd":         6,
	"bench":       6,
	"examples":    6,
	"integration": 6,
}

// folder returns the top-level folder of a package of the workspace.
func folder(pkg string) string {
	rel := strings.TrimPrefix(strings.TrimPrefix(pkg, module), "/")
	top, _, _ := strings.Cut(rel, "/")
	return top
}

// TestNoImportRunsUpward fails when a package's non-test code imports a
// package of a folder ranked above its own (layers), and when a folder
// has no rank. It reads the imports with go list, over every module of
// the workspace.
func TestNoImportRunsUpward(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	root := filepath.Join("..", "..")
	mods, err := goCmd(root, "list", "-m", "-f", "{{.Path}}/...")
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`}, strings.Fields(string(mods))...)
	out, err := goCmd(root, args...)
	if err != nil {
		t.Fatal(err)
	}
	pkgs := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		pkgs++
		from := folder(f[0])
		rank, ok := layers[from]
		if !ok {
			t.Errorf("%s is in folder %q, which has no layer: add it to layers", f[0], from)
			continue
		}
		for _, imp := range f[1:] {
			if imp != module && !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := folder(imp)
			if to == from {
				continue
			}
			if r, ok := layers[to]; ok && r > rank {
				t.Errorf("%s (%s, layer %d) imports %s (%s, layer %d): an import from a lower layer to a higher one", f[0], from, rank, imp, to, r)
			}
		}
	}
	if pkgs < 50 {
		t.Fatalf("go list named only %d packages; is the workspace read?", pkgs)
	}
}

func goCmd(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, &cmdError{args: args, err: err, stderr: stderr.String()}
	}
	return out, nil
}

type cmdError struct {
	args   []string
	err    error
	stderr string
}

func (e *cmdError) Error() string {
	return "go " + strings.Join(e.args[:min(2, len(e.args))], " ") + ": " + e.err.Error() + ": " + e.stderr
}
