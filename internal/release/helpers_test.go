package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// writeTree writes files (slash paths relative to dir) under dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// gitCommit commits everything in the repository at dir, creating it
// first if need be.
func gitCommit(t *testing.T, dir, msg string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, ".git")); err != nil {
		run(t, dir, nil, "git", "init", "-q")
	}
	run(t, dir, nil, "git", "add", "-A")
	run(t, dir, nil, "git", "-c", "user.name=release test", "-c", "user.email=release@test.invalid",
		"-c", "commit.gpgsign=false", "commit", "-q", "--allow-empty", "-m", msg)
}

// run runs a command in dir with env added to the test's environment,
// and fails the test if it fails.
func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	out, err := runErr(dir, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, out)
	}
	return out
}

func runErr(dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.String(), err
}

// goEnv is the environment of a go command that sees the world as a user
// outside this repository does: no workspace, modules from the proxy
// directory at proxyDir (then the machine's module cache, then the
// machine's GOPROXY) into an empty module cache, and no checksum database
// (the modules of this repository are on no public proxy; go.sum files
// are still checked).
func goEnv(t *testing.T, proxyDir string) []string {
	t.Helper()
	modcache := strings.TrimSpace(run(t, ".", nil, "go", "env", "GOMODCACHE"))
	goproxy := strings.TrimSpace(run(t, ".", nil, "go", "env", "GOPROXY"))
	tmp := t.TempDir()
	return []string{
		"GOWORK=off",
		"GOTOOLCHAIN=local",
		"GOPROXY=" + fileURL(proxyDir) + "," + fileURL(filepath.Join(modcache, "cache", "download")) + "," + goproxy,
		"GOSUMDB=off",
		"GOPRIVATE=",
		"GONOPROXY=",
		"GOMODCACHE=" + filepath.Join(tmp, "modcache"),
		"GOFLAGS=-modcacherw",
		"GOBIN=" + filepath.Join(tmp, "bin"),
	}
}

func fileURL(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		panic(err)
	}
	return "file://" + filepath.ToSlash(abs)
}
