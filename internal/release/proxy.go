package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/module"
)

func runProxy(args []string) error {
	fs := flag.NewFlagSet("proxy", flag.ExitOnError)
	root := fs.String("root", "../..", "the repository's root")
	v := fs.String("version", "", "the version to serve the modules at")
	out := fs.String("out", "", "the directory to write the proxy to")
	fs.Parse(args)
	if *v == "" || *out == "" || fs.NArg() != 0 {
		return errors.New("want -version and -out")
	}
	if err := buildProxy(*root, *v, *out); err != nil {
		return err
	}
	abs, err := filepath.Abs(*out)
	if err != nil {
		return err
	}
	fmt.Printf("GOPROXY=file://%s\n", filepath.ToSlash(abs))
	return nil
}

// buildProxy writes, under out, the released modules of the tree at root
// at version v in the layout of a module proxy (GOPROXY=file:///out):
// <escaped path>/@v/list, v.info, v.mod and v.zip. The tree's files are
// those git tracks.
func buildProxy(root, v, out string) error {
	if err := checkVersion(v); err != nil {
		return err
	}
	mods, err := repoModules(root)
	if err != nil {
		return err
	}
	tracked, err := trackedFiles(root)
	if err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{v, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	for _, m := range mods {
		if !m.Released {
			continue
		}
		esc, err := module.EscapePath(m.Path)
		if err != nil {
			return err
		}
		escV, err := module.EscapeVersion(v)
		if err != nil {
			return err
		}
		dir := filepath.Join(out, filepath.FromSlash(esc), "@v")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		gomod, err := os.ReadFile(filepath.Join(root, m.Dir, "go.mod"))
		if err != nil {
			return err
		}
		z, err := moduleZip(root, tracked, m, v)
		if err != nil {
			return fmt.Errorf("%s: %w", m.Path, err)
		}
		list, err := os.ReadFile(filepath.Join(dir, "list"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if !strings.Contains("\n"+string(list), "\n"+v+"\n") {
			list = append(list, v+"\n"...)
		}
		for name, data := range map[string][]byte{
			"list":         list,
			escV + ".info": info,
			escV + ".mod":  gomod,
			escV + ".zip":  z,
		} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}
