package cli_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/cli"
)

// runBare executes the command tree with args only: no --database-url
// added.
func runBare(t *testing.T, args ...string) (result, error) {
	t.Helper()
	root := cli.NewRoot(stock)
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetIn(strings.NewReader(""))
	root.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := root.ExecuteContext(ctx)
	return result{out.String(), errb.String()}, err
}

// The URL can come from a file, so that the password it holds is not on
// the command line; the file and the flag together are refused.
func TestDatabaseURLFile(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must(stock, "migrate", "--yes")
	file := filepath.Join(t.TempDir(), "db-url")
	if err := os.WriteFile(file, []byte(e.url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r, err := runBare(t, "stats", "--database-url-file", file); err != nil {
		t.Fatalf("stats --database-url-file: %v\n%s", err, r.err)
	}
	if _, err := runBare(t, "stats", "--database-url-file", file, "--database-url", e.url); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Fatalf("both forms: %v", err)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := runBare(t, "stats", "--database-url-file", empty); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("an empty file: %v", err)
	}

	// A password on the command line works, with a warning.
	u, err := url.Parse(e.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "s3cret")
	r, err := runBare(t, "stats", "--database-url", u.String())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.err, "warning: --database-url holds a password") || !strings.Contains(r.err, "--database-url-file") {
		t.Fatalf("no warning about the password on the command line:\n%s", r.err)
	}
}

// $EFFECTIVELY_DATABASE_URL comes before $DATABASE_URL. (Not parallel: it
// sets the environment.)
func TestDatabaseURLEnvironment(t *testing.T) {
	e := newEnv(t)
	e.must(stock, "migrate", "--yes")
	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/nothing?connect_timeout=5")
	t.Setenv("EFFECTIVELY_DATABASE_URL", e.url)
	if r, err := runBare(t, "stats"); err != nil {
		t.Fatalf("stats with $EFFECTIVELY_DATABASE_URL: %v\n%s", err, r.err)
	}
	t.Setenv("EFFECTIVELY_DATABASE_URL", "")
	if _, err := runBare(t, "stats"); err == nil || !strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("stats with only $DATABASE_URL: %v", err)
	}
}

// tcpProxy forwards TCP connections on a loopback port to the server's
// Unix socket, so that the driver tries TLS first as it does over TCP.
func tcpProxy(t *testing.T, dbURL string) (host string, port string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(u.Query().Get("host"), ".s.PGSQL."+u.Query().Get("port"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("unix", sock)
			if err != nil {
				_ = c.Close()
				continue
			}
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				_ = dst.Close()
				_ = src.Close()
			}
			go pipe(s, c)
			go pipe(c, s)
		}
	}()
	h, p, _ := net.SplitHostPort(ln.Addr().String())
	return h, p
}

// With sslmode=prefer (the default) against a server without TLS, a failed
// login reports the login's error, not the refused TLS attempt before it;
// with sslmode=require the TLS error is the answer.
func TestDatabaseConnectErrorWithoutTLSNoise(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	host, port := tcpProxy(t, e.url)
	u, err := url.Parse(e.url)
	if err != nil {
		t.Fatal(err)
	}
	base := "postgres://nosuchrole@" + net.JoinHostPort(host, port) + u.Path

	_, err = runBare(t, "stats", "--database-url", base)
	if err == nil || !strings.Contains(err.Error(), `role "nosuchrole" does not exist`) {
		t.Fatalf("login with a role that does not exist: %v", err)
	}
	if strings.Contains(err.Error(), "tls error") || strings.Contains(err.Error(), "refused TLS") {
		t.Fatalf("the refused TLS attempt of sslmode=prefer is reported:\n%v", err)
	}

	_, err = runBare(t, "stats", "--database-url", base+"?sslmode=require")
	if err == nil || !strings.Contains(err.Error(), "server refused TLS connection") {
		t.Fatalf("sslmode=require against a server without TLS: %v", err)
	}
}
