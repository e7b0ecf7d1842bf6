package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	modzip "golang.org/x/mod/zip"
)

// diskFile is a file of the tree, named by its path inside a module zip.
type diskFile struct {
	name string // path inside the module
	abs  string
}

func (f diskFile) Path() string                 { return f.name }
func (f diskFile) Lstat() (os.FileInfo, error)  { return os.Lstat(f.abs) }
func (f diskFile) Open() (io.ReadCloser, error) { return os.Open(f.abs) }

// moduleZip builds m's zip at version v from the tracked files of the tree
// at root, as the module proxy builds it from a tag: the files under the
// module's directory, less those of modules nested in it (modzip.Create
// leaves those out), plus the repository's LICENSE when the module is in a
// subdirectory that has none.
func moduleZip(root string, tracked []string, m repoModule, v string) ([]byte, error) {
	var files []modzip.File
	prefix := m.TagPrefix()
	hasLicense := false
	for _, f := range tracked {
		name, ok := strings.CutPrefix(f, prefix)
		if !ok {
			continue
		}
		if name == "LICENSE" {
			hasLicense = true
		}
		files = append(files, diskFile{name: name, abs: filepath.Join(root, filepath.FromSlash(f))})
	}
	if prefix != "" && !hasLicense && slices.Contains(tracked, "LICENSE") {
		files = append(files, diskFile{name: "LICENSE", abs: filepath.Join(root, "LICENSE")})
	}
	var buf bytes.Buffer
	if err := modzip.Create(&buf, module.Version{Path: m.Path, Version: v}, files); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// sums are the two go.sum hashes of a module version: of its zip, and of
// its go.mod.
type sums struct {
	Zip, Mod string
}

// moduleSums hashes a module zip and its go.mod as the go command does.
func moduleSums(zipData, gomod []byte) (sums, error) {
	tmp, err := os.CreateTemp("", "release-*.zip")
	if err != nil {
		return sums{}, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(zipData); err != nil {
		tmp.Close()
		return sums{}, err
	}
	if err := tmp.Close(); err != nil {
		return sums{}, err
	}
	z, err := dirhash.HashZip(tmp.Name(), dirhash.Hash1)
	if err != nil {
		return sums{}, err
	}
	mod, err := dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gomod)), nil
	})
	if err != nil {
		return sums{}, err
	}
	return sums{Zip: z, Mod: mod}, nil
}
