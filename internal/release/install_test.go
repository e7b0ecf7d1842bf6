package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
)

// releaseTestVersion is the fake version the tree is released at. It is
// served only from the test's own proxy directory into the test's own
// module cache.
const releaseTestVersion = "v0.99.0-releasetest"

// TestInstallAtVersion proves that a release of this tree installs: a
// copy of it (its tracked and untracked, not ignored, files) is prepared
// at a fake version, every released module is checked tidy against a
// file-based GOPROXY built from it, and go install
// .../cmd/effectively@version, with no workspace, builds a binary that
// reports that version.
func TestInstallAtVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/effectively from a fresh module cache")
	}
	start := time.Now()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(t.TempDir(), "tree")
	copyTree(t, root, tree)
	gitCommit(t, tree, "the tree")

	mods, err := prepare(tree, releaseTestVersion)
	if err != nil {
		t.Fatal(err)
	}
	gitCommit(t, tree, "release "+releaseTestVersion)
	proxy := t.TempDir()
	if err := buildProxy(tree, releaseTestVersion, proxy); err != nil {
		t.Fatal(err)
	}
	env := goEnv(t, proxy)

	for _, m := range mods {
		if !m.Released || m.Dir == "." {
			continue
		}
		gomod, err := os.ReadFile(filepath.Join(tree, m.Dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		f, err := modfile.ParseLax("go.mod", gomod, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(f.Replace) > 0 {
			t.Errorf("%s/go.mod keeps a replace directive after prepare:\n%s", m.Dir, gomod)
		}
		// Tidy against the proxy: every requirement is listed, and every
		// go.sum hash of this repository's modules is the proxy's.
		if out, err := runErr(filepath.Join(tree, m.Dir), env, "go", "mod", "tidy", "-diff"); err != nil {
			t.Errorf("%s is not tidy as released (run make tidy): %v\n%s", m.Dir, err, withoutDownloads(out))
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("prepared, served and checked tidy in %v", time.Since(start).Round(time.Millisecond))
	start = time.Now()

	run(t, t.TempDir(), env, "go", "install", "github.com/effectively-once/effectively/cmd/effectively@"+releaseTestVersion)
	t.Logf("installed in %v", time.Since(start).Round(time.Millisecond))
	bin := filepath.Join(envValue(env, "GOBIN"), "effectively")
	out := run(t, t.TempDir(), nil, bin, "--version")
	if want := "effectively version " + releaseTestVersion; strings.TrimSpace(out) != want {
		t.Errorf("effectively --version printed %q, want %q", out, want)
	}
	if out := run(t, t.TempDir(), nil, bin, "--help"); !strings.Contains(out, "migrate") {
		t.Errorf("effectively --help does not list migrate:\n%s", out)
	}
}

// copyTree copies the files of the repository at root that git tracks or
// would track (untracked files that are not ignored) to dir.
func copyTree(t *testing.T, root, dir string) {
	t.Helper()
	out := run(t, root, nil, "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	for _, name := range strings.Split(out, "\x00") {
		if name == "" {
			continue
		}
		src := filepath.Join(root, filepath.FromSlash(name))
		fi, err := os.Lstat(src)
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the work tree, or not a plain file
		}
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

// withoutDownloads drops the go command's "go: downloading" lines from its
// output.
func withoutDownloads(out string) string {
	var keep []string
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "go: downloading ") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}
