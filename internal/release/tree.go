package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
)

// A repoModule is a module of the repository, as go.work lists it.
type repoModule struct {
	// Dir is the module's directory relative to the root, slash-separated;
	// "." for the core.
	Dir string
	// Path is the module path its go.mod declares.
	Path string
	// Released says whether the module is tagged with the core (see
	// released).
	Released bool
}

// unreleasedDirs name the directories whose modules are never tagged: the
// examples, the benchmarks, the integration suites (the failover runs and
// the Kafka chaos run) and the tools under internal/, which are never
// installed at a version.
var unreleasedDirs = []string{"examples", "bench", "integration", "internal"}

// released says whether the module in dir (slash-separated, relative to
// the root) is tagged with the core: whether no element of dir is one of
// unreleasedDirs.
func released(dir string) bool {
	return !slices.ContainsFunc(strings.Split(dir, "/"), func(elem string) bool {
		return slices.Contains(unreleasedDirs, elem)
	})
}

// TagPrefix is what precedes the version in the module's tags: "" for the
// core, "cli/" for the module in cli.
func (m repoModule) TagPrefix() string {
	if m.Dir == "." {
		return ""
	}
	return m.Dir + "/"
}

// Tag is the module's tag for version v.
func (m repoModule) Tag(v string) string { return m.TagPrefix() + v }

// repoModules reads the modules of the tree at root from its go.work.
func repoModules(root string) ([]repoModule, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, err
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	var mods []repoModule
	for _, u := range wf.Use {
		dir := path.Clean(filepath.ToSlash(u.Path))
		if dir == ".." || strings.HasPrefix(dir, "../") || path.IsAbs(dir) {
			return nil, fmt.Errorf("go.work: %s is outside the tree", u.Path)
		}
		gomod, err := os.ReadFile(filepath.Join(root, dir, "go.mod"))
		if err != nil {
			return nil, err
		}
		p := modfile.ModulePath(gomod)
		if p == "" {
			return nil, fmt.Errorf("%s/go.mod: no module path", dir)
		}
		mods = append(mods, repoModule{
			Dir:      dir,
			Path:     p,
			Released: released(dir),
		})
	}
	if !slices.ContainsFunc(mods, func(m repoModule) bool { return m.Dir == "." }) {
		return nil, fmt.Errorf("go.work does not use the root module")
	}
	return mods, nil
}

// git runs git in dir and returns its standard output.
func git(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// trackedFiles lists the files git tracks in the tree at root (slash
// paths relative to root), leaving out those deleted from the work tree.
func trackedFiles(root string) ([]string, error) {
	out, err := git(root, "ls-files", "-z")
	if err != nil {
		return nil, err
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, filepath.FromSlash(f))); err != nil {
			continue
		}
		files = append(files, f)
	}
	return files, nil
}
