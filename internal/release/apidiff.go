package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/exp/apidiff"
	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
	"golang.org/x/tools/go/packages"
)

func runAPIDiff(args []string) error {
	fs := flag.NewFlagSet("apidiff", flag.ExitOnError)
	root := fs.String("root", "../..", "the repository's root")
	fs.Parse(args)
	if fs.NArg() != 0 {
		return errors.New("want no arguments")
	}
	n, err := apiDiff(*root, os.Stdout)
	if err != nil {
		return err
	}
	if n > 0 {
		return fmt.Errorf("%d incompatible change(s) since the last tag: once a version is tagged, an exported signature changes only with a deprecation path (add the new, mark the old Deprecated)", n)
	}
	return nil
}

// apiDiff compares the exported API of each released module of the tree
// at root with the module's last tag, writes the changes to w, and returns
// how many are incompatible. A module with no tag is skipped, saying so.
func apiDiff(root string, w io.Writer) (int, error) {
	mods, err := repoModules(root)
	if err != nil {
		return 0, err
	}
	tmp, err := os.MkdirTemp("", "apidiff-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	if out, err := git(root, "rev-parse", "--is-shallow-repository"); err == nil && strings.TrimSpace(string(out)) == "true" {
		fmt.Fprintln(w, "apidiff: this is a shallow clone, which may lack the tags to compare with (git fetch --unshallow --tags)")
	}
	trees := make(map[string]string) // commit → extracted tree
	incompatible := 0
	for _, m := range mods {
		if !m.Released {
			continue
		}
		tag, err := lastTag(root, m)
		if err != nil {
			return 0, err
		}
		if tag == "" {
			fmt.Fprintf(w, "apidiff: %s: no tag %sv* yet, nothing to compare\n", m.Path, m.TagPrefix())
			continue
		}
		commit, err := git(root, "rev-list", "-n", "1", tag)
		if err != nil {
			return 0, err
		}
		old, ok := trees[string(commit)]
		if !ok {
			old = filepath.Join(tmp, fmt.Sprint(len(trees)))
			if err := extract(root, tag, old); err != nil {
				return 0, err
			}
			trees[string(commit)] = old
		}
		oldMod, err := loadModule(old, m.Dir)
		if err != nil {
			return 0, fmt.Errorf("%s at %s: %w", m.Path, tag, err)
		}
		newMod, err := loadModule(root, m.Dir)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", m.Path, err)
		}
		if len(oldMod.Packages) == 0 && len(newMod.Packages) == 0 {
			fmt.Fprintf(w, "apidiff: %s: no importable packages, nothing to compare\n", m.Path)
			continue
		}
		report := apidiff.ModuleChanges(oldMod, newMod)
		n := 0
		for _, c := range report.Changes {
			if !c.Compatible {
				n++
			}
		}
		fmt.Fprintf(w, "apidiff: %s against %s: %d incompatible, %d compatible change(s)\n", m.Path, tag, n, len(report.Changes)-n)
		if n > 0 {
			if err := report.TextIncompatible(w, true); err != nil {
				return 0, err
			}
		}
		incompatible += n
	}
	return incompatible, nil
}

// lastTag returns m's highest tagged version, as the tag's full name, or
// "" when the module has none.
func lastTag(root string, m repoModule) (string, error) {
	out, err := git(root, "tag", "--list", m.TagPrefix()+"v*")
	if err != nil {
		return "", err
	}
	best := ""
	for _, t := range strings.Fields(string(out)) {
		v := strings.TrimPrefix(t, m.TagPrefix())
		if !semver.IsValid(v) || strings.Contains(v, "/") {
			continue
		}
		if best == "" || semver.Compare(v, strings.TrimPrefix(best, m.TagPrefix())) > 0 {
			best = t
		}
	}
	return best, nil
}

// extract writes the tree at rev to dir.
func extract(root, rev, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	archive := exec.Command("git", "archive", "--format=tar", rev)
	archive.Dir = root
	archive.Stderr = os.Stderr
	untar := exec.Command("tar", "-x", "-C", dir)
	untar.Stderr = os.Stderr
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	untar.Stdin = pipe
	if err := untar.Start(); err != nil {
		return err
	}
	if err := archive.Run(); err != nil {
		untar.Wait()
		return fmt.Errorf("git archive %s: %w", rev, err)
	}
	if err := untar.Wait(); err != nil {
		return fmt.Errorf("extracting %s: %w", rev, err)
	}
	return nil
}

// loadModule type-checks the importable packages of the module in dir of
// the tree at root: every package but commands and internal ones. It
// builds in the tree's workspace when the tree has a go.work, so that
// the module's requirements on the repository's other modules are
// satisfied from the same tree.
func loadModule(root, dir string) (*apidiff.Module, error) {
	root, err := filepath.Abs(root) // GOWORK must be absolute
	if err != nil {
		return nil, err
	}
	modDir := filepath.Join(root, filepath.FromSlash(dir))
	gomod, err := os.ReadFile(filepath.Join(modDir, "go.mod"))
	if err != nil {
		return nil, err
	}
	modPath := modfile.ModulePath(gomod)
	work := filepath.Join(root, "go.work")
	if _, err := os.Stat(work); err != nil {
		work = "off"
	}
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedTypes,
		Dir:  modDir,
		Env:  append(os.Environ(), "GOWORK="+work),
	}
	pkgs, err := packages.Load(cfg, "./...")
	if err != nil {
		return nil, err
	}
	var errs []error
	mod := &apidiff.Module{Path: modPath}
	for _, p := range pkgs {
		for _, e := range p.Errors {
			errs = append(errs, e)
		}
		if p.Name == "main" || isInternal(strings.TrimPrefix(p.PkgPath, modPath)) {
			continue
		}
		mod.Packages = append(mod.Packages, p.Types)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return mod, nil
}

// isInternal reports whether a package path, relative to its module's,
// has an internal element.
func isInternal(rel string) bool {
	for _, e := range strings.Split(rel, "/") {
		if e == "internal" {
			return true
		}
	}
	return false
}
