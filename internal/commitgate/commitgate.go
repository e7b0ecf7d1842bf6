// Package commitgate is a TCP proxy between a client of PostgreSQL (a
// worker in a child process, say) and the server, that stops at the COMMIT
// of a batch transaction: a test freezes the worker there, with its COMMIT
// either held back from the server (the transaction stays open, holding
// its locks) or executed by the server with its reply not yet read.
//
// A batch transaction is one begun by a simple query that starts with
// BEGIN and sets idle_in_transaction_session_timeout, as the consumer's
// batches are (consumer.Config.IdleTxTimeout). The proxy reads the
// client's messages whole (the PostgreSQL wire protocol) and passes
// everything else on as it comes.
package commitgate

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Mode says what becomes of the COMMIT the gate stops at.
type Mode uint8

const (
	// Hold keeps the COMMIT from the server until Release: the server
	// sees the transaction idle, holding its locks.
	Hold Mode = iota + 1
	// Forward passes the COMMIT on once the stop function returned: the
	// server commits, and its reply waits for the frozen client.
	Forward
)

// Gate is a listening proxy to one PostgreSQL server.
type Gate struct {
	ln       net.Listener
	network  string
	addr     string
	mu       sync.Mutex
	armed    bool
	mode     Mode
	stop     func()
	caught   chan struct{}
	release  chan struct{}
	released atomic.Bool
}

// New starts a gate on a loopback port in front of the server cfg names
// (its first host), closed when the test ends.
func New(tb testing.TB, cfg *pgconn.Config) *Gate {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	network, addr := pgconn.NetworkAddress(cfg.Host, cfg.Port)
	g := &Gate{ln: ln, network: network, addr: addr, caught: make(chan struct{}), release: make(chan struct{})}
	go g.accept()
	tb.Cleanup(func() {
		g.Release()
		_ = ln.Close()
	})
	return g
}

// Addr is the gate's address, host:port over TCP.
func (g *Gate) Addr() string { return g.ln.Addr().String() }

// Arm makes the gate stop at the next COMMIT of a batch transaction on any
// of its connections: it calls stop (which freezes the client, say), then
// holds the COMMIT until Release or forwards it, as mode says.
func (g *Gate) Arm(mode Mode, stop func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.mode, g.stop = true, mode, stop
}

// Caught is closed once the gate stopped at a COMMIT and stop returned.
func (g *Gate) Caught() <-chan struct{} { return g.caught }

// Release sends a held COMMIT on to the server (on a connection the server
// may have closed meanwhile).
func (g *Gate) Release() {
	if g.released.CompareAndSwap(false, true) {
		close(g.release)
	}
}

func (g *Gate) accept() {
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		go g.serve(c)
	}
}

func (g *Gate) serve(client net.Conn) {
	server, err := (&net.Dialer{}).DialContext(context.Background(), g.network, g.addr)
	if err != nil {
		_ = client.Close()
		return
	}
	closeBoth := sync.OnceFunc(func() { _ = client.Close(); _ = server.Close() })
	go func() {
		// The server's replies, including a FATAL error before it closes
		// the session, reach the client; then the client sees EOF.
		_, _ = io.Copy(client, server)
		closeBoth()
	}()
	_ = g.clientToServer(client, server)
	closeBoth()
}

// Codes of the untyped messages a client may send before its startup
// message.
const (
	sslRequest    = 80877103
	gssEncRequest = 80877104
)

func (g *Gate) clientToServer(client io.Reader, server io.Writer) error {
	// The untyped messages: SSL or GSS encryption requests (the server
	// answers each with one byte), then the startup message.
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(client, hdr[:]); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:4])
		if n < 8 {
			return errors.New("commitgate: malformed startup message")
		}
		body := make([]byte, n-8)
		if _, err := io.ReadFull(client, body); err != nil {
			return err
		}
		if _, err := server.Write(append(hdr[:], body...)); err != nil {
			return err
		}
		if code := binary.BigEndian.Uint32(hdr[4:]); code != sslRequest && code != gssEncRequest {
			break
		}
	}
	inBatch := false
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(client, hdr[:]); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n < 4 {
			return errors.New("commitgate: malformed message")
		}
		msg := make([]byte, 5+n-4)
		copy(msg, hdr[:])
		if _, err := io.ReadFull(client, msg[5:]); err != nil {
			return err
		}
		if hdr[0] == 'Q' {
			q := strings.ToLower(string(bytes.TrimRight(msg[5:], "\x00")))
			switch {
			case strings.HasPrefix(q, "begin") && strings.Contains(q, "idle_in_transaction_session_timeout"):
				inBatch = true
			case q == "commit" && inBatch:
				inBatch = false
				g.atCommit()
			case q == "rollback":
				inBatch = false
			}
		}
		if _, err := server.Write(msg); err != nil {
			return err
		}
	}
}

// atCommit stops at a batch's COMMIT when armed.
func (g *Gate) atCommit() {
	g.mu.Lock()
	armed, mode, stop := g.armed, g.mode, g.stop
	g.armed = false
	g.mu.Unlock()
	if !armed {
		return
	}
	stop()
	close(g.caught)
	if mode == Hold {
		<-g.release
	}
}
