package pgtest

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// CommitLoss is a network between a client and PostgreSQL that can be
// told to lose the server's reply to the next COMMIT: the server commits,
// and the client sees its connection break while it waits for the answer.
// It is how a test makes a COMMIT's outcome unknown to the code under test
// on cue. Use Dial as pgconn.Config.DialFunc, or Pool.
type CommitLoss struct {
	armed   atomic.Bool
	dropped atomic.Int32
}

// Arm makes the next COMMIT sent on any of the dialer's connections lose
// its reply.
func (d *CommitLoss) Arm() { d.armed.Store(true) }

// Dropped returns how many COMMIT replies were lost so far.
func (d *CommitLoss) Dropped() int { return int(d.dropped.Load()) }

// Dial dials the server like net.Dialer, through d.
func (d *CommitLoss) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &commitLossConn{Conn: c, d: d}, nil
}

// Pool returns a pool on url whose connections go through d, closed when
// the test ends.
func (d *CommitLoss) Pool(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.ConnConfig.DialFunc = d.Dial
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

type commitLossConn struct {
	net.Conn
	d         *CommitLoss
	mu        sync.Mutex
	committed bool // a COMMIT went out while armed; its reply is to be lost
}

// commitQuery is the simple-protocol query pgx sends for Tx.Commit.
var commitQuery = append([]byte("commit"), 0)

func (c *commitLossConn) Write(p []byte) (int, error) {
	if len(p) > 5 && p[0] == 'Q' && bytes.Equal(p[5:], commitQuery) && c.d.armed.CompareAndSwap(true, false) {
		c.mu.Lock()
		c.committed = true
		c.mu.Unlock()
	}
	return c.Conn.Write(p)
}

func (c *commitLossConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	drop := c.committed && n > 0
	c.mu.Unlock()
	if drop {
		// The server answered the COMMIT: it is durable. Lose the answer.
		c.d.dropped.Add(1)
		c.Conn.Close()
		return 0, errors.New("connection reset (the reply to COMMIT was lost on purpose)")
	}
	return n, err
}
