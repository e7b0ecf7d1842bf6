package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

func runPrepare(args []string) error {
	fs := flag.NewFlagSet("prepare", flag.ExitOnError)
	root := fs.String("root", "../..", "the repository's root")
	allowDirty := fs.Bool("allow-dirty", false, "hash the work tree even where it differs from the commit")
	fs.Parse(args)
	if fs.NArg() != 1 {
		return errors.New("want one argument, the version (e.g. v0.1.0)")
	}
	v := fs.Arg(0)
	if !*allowDirty {
		out, err := git(*root, "status", "--porcelain", "--untracked-files=no")
		if err != nil {
			return err
		}
		if len(out) > 0 {
			return fmt.Errorf("the tree has uncommitted changes; commit them first, so that the hashes written to go.sum are those of the tagged commit:\n%s", out)
		}
	}
	mods, err := prepare(*root, v)
	if err != nil {
		return err
	}
	fmt.Printf("The released modules now require each other at %s, with no replace directives.\n", v)
	fmt.Println("Commit (adding any go.sum it created), then tag that commit for each module and push the tags:")
	fmt.Println()
	var tags []string
	for _, m := range mods {
		if m.Released {
			tags = append(tags, m.Tag(v))
			fmt.Printf("\tgit tag -a %s -m '%s %s'\n", m.Tag(v), m.Path, v)
		}
	}
	fmt.Printf("\tgit push origin %s\n", strings.Join(tags, " "))
	return nil
}

// checkVersion refuses a version that is not a canonical semantic version
// this repository's module paths can carry (they have no /vN suffix).
func checkVersion(v string) error {
	if !semver.IsValid(v) || semver.Canonical(v) != v {
		return fmt.Errorf("%q is not a canonical semantic version such as v0.1.0", v)
	}
	if m := semver.Major(v); m != "v0" && m != "v1" {
		return fmt.Errorf("%s: a major version past v1 needs a /%s suffix on every module path", v, m)
	}
	return nil
}

// prepare rewrites, in the tree at root, the go.mod and go.sum of every
// released module so that it requires the repository's other modules at
// version v with no replace directive, and returns the tree's modules.
// Modules are done in dependency order: a module's go.sum records the
// hash of each module of the repository it requires, which covers that
// module's own rewritten go.mod and go.sum.
func prepare(root, v string) ([]repoModule, error) {
	if err := checkVersion(v); err != nil {
		return nil, err
	}
	mods, err := repoModules(root)
	if err != nil {
		return nil, err
	}
	tracked, err := trackedFiles(root)
	if err != nil {
		return nil, err
	}
	byPath := make(map[string]repoModule)
	for _, m := range mods {
		byPath[m.Path] = m
	}
	order, err := dependencyOrder(root, mods, byPath)
	if err != nil {
		return nil, err
	}
	hashes := make(map[string]sums)
	for _, m := range order {
		if m.Dir != "." {
			if err := rewriteModule(root, m, v, byPath, hashes); err != nil {
				return nil, err
			}
			// A go.sum the rewrite created is part of the commit to tag.
			if sum := m.TagPrefix() + "go.sum"; !slices.Contains(tracked, sum) {
				tracked = append(tracked, sum)
			}
		}
		z, err := moduleZip(root, tracked, m, v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.Path, err)
		}
		gomod, err := os.ReadFile(filepath.Join(root, m.Dir, "go.mod"))
		if err != nil {
			return nil, err
		}
		if hashes[m.Path], err = moduleSums(z, gomod); err != nil {
			return nil, err
		}
	}
	return mods, nil
}

// repoRequires lists the modules of the repository that m's go.mod
// requires.
func repoRequires(root string, m repoModule, byPath map[string]repoModule) ([]string, *modfile.File, error) {
	file := filepath.Join(root, m.Dir, "go.mod")
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	f, err := modfile.Parse(file, data, nil)
	if err != nil {
		return nil, nil, err
	}
	var req []string
	for _, r := range f.Require {
		if _, ok := byPath[r.Mod.Path]; ok {
			req = append(req, r.Mod.Path)
		}
	}
	return req, f, nil
}

// dependencyOrder returns the released modules, each after the modules of
// the repository it requires.
func dependencyOrder(root string, mods []repoModule, byPath map[string]repoModule) ([]repoModule, error) {
	deps := make(map[string][]string)
	for _, m := range mods {
		if !m.Released {
			continue
		}
		req, _, err := repoRequires(root, m, byPath)
		if err != nil {
			return nil, err
		}
		for _, p := range req {
			if !byPath[p].Released {
				return nil, fmt.Errorf("%s requires %s, which is not released (it is under examples/, bench/, integration/ or internal/)", m.Path, p)
			}
		}
		deps[m.Path] = req
	}
	var order []repoModule
	state := make(map[string]int) // 1: visiting, 2: done
	var visit func(p string) error
	visit = func(p string) error {
		switch state[p] {
		case 1:
			return fmt.Errorf("the modules' requirements form a cycle through %s", p)
		case 2:
			return nil
		}
		state[p] = 1
		for _, d := range deps[p] {
			if err := visit(d); err != nil {
				return err
			}
		}
		state[p] = 2
		order = append(order, byPath[p])
		return nil
	}
	for _, m := range mods {
		if m.Released {
			if err := visit(m.Path); err != nil {
				return nil, err
			}
		}
	}
	return order, nil
}

// rewriteModule points m's requirements on the repository's modules at v,
// drops its replace directives for them, and records their hashes in its
// go.sum.
func rewriteModule(root string, m repoModule, v string, byPath map[string]repoModule, hashes map[string]sums) error {
	req, f, err := repoRequires(root, m, byPath)
	if err != nil {
		return err
	}
	for _, p := range req {
		if err := f.AddRequire(p, v); err != nil {
			return err
		}
	}
	for _, r := range slices.Clone(f.Replace) {
		if _, ok := byPath[r.Old.Path]; !ok {
			return fmt.Errorf("%s/go.mod: replace %s: a released module may replace only the repository's own modules (go install at a version refuses any replace)", m.Dir, r.Old.Path)
		}
		if err := f.DropReplace(r.Old.Path, r.Old.Version); err != nil {
			return err
		}
	}
	f.Cleanup()
	gomod, err := f.Format()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, m.Dir, "go.mod"), gomod, 0o644); err != nil {
		return err
	}

	sumFile := filepath.Join(root, m.Dir, "go.sum")
	add := make(map[module.Version]string)
	for _, p := range req {
		h, ok := hashes[p]
		if !ok {
			return fmt.Errorf("%s requires %s, not yet hashed", m.Path, p)
		}
		add[module.Version{Path: p, Version: v}] = h.Zip
		add[module.Version{Path: p, Version: v + "/go.mod"}] = h.Mod
	}
	return addSums(sumFile, add)
}

// addSums sets the go.sum lines of the module versions in add, replacing
// any other hash recorded for them, and writes the file in go's order.
func addSums(file string, add map[module.Version]string) error {
	data, err := os.ReadFile(file)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	lines := make(map[module.Version][]string)
	for i, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 3 {
			return fmt.Errorf("%s:%d: malformed line", file, i+1)
		}
		mv := module.Version{Path: fields[0], Version: fields[1]}
		lines[mv] = append(lines[mv], fields[2])
	}
	for mv, h := range add {
		lines[mv] = []string{h}
	}
	keys := make([]module.Version, 0, len(lines))
	for mv := range lines {
		keys = append(keys, mv)
	}
	module.Sort(keys)
	var buf bytes.Buffer
	for _, mv := range keys {
		for _, h := range lines[mv] {
			fmt.Fprintf(&buf, "%s %s %s\n", mv.Path, mv.Version, h)
		}
	}
	return os.WriteFile(file, buf.Bytes(), 0o644)
}
