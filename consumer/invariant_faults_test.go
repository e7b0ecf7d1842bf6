package consumer_test

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/jackc/pgx/v5"
)

// The faults of an invariant run that need more than the broker: failures
// in the handler, backends terminated from the admin connection, and
// connections lost right after COMMIT was sent.

// commitKill is a kill aimed at a batch's COMMIT.
type commitKill struct {
	xid       string
	reportErr bool // the batch reported an error
	reported  bool
}

// strike reports whether fault f is planned for this delivery and has not
// struck yet (a batch may run its handler several times in one delivery),
// and marks it struck.
func (r *invRun) strike(s *stored, attempt int, f fault) bool {
	if s.faults[attempt] != f {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	k := [2]int{s.serial, attempt}
	if r.fired[k] {
		return false
	}
	r.fired[k] = true
	switch f {
	case killHandler:
		r.stats.killHandler++
	case crashHandler:
		r.stats.crash++
	case killCommit:
		r.stats.killCommit++
	case dropCommit:
		r.stats.dropCommit++
	}
	r.event(s, "%s", f)
	return true
}

// transientAttempts bounds the deliveries a transient failure strikes: far
// below invMaxAttempts.
const transientAttempts = 4

// transient reports whether this delivery of s fails transiently: one of
// the first l.transient deliveries of its logical message to reach the
// handler, over all copies (so a copy may succeed where the original
// failed), while its Attempt is low.
func (r *invRun) transient(s *stored, attempt int) bool {
	l := s.logical
	if l.transient == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	k := [2]int{s.serial, attempt}
	if r.failedOnce[k] {
		return true
	}
	if r.transients[l.id] >= l.transient || attempt > transientAttempts {
		return false
	}
	r.transients[l.id]++
	r.failedOnce[k] = true
	return true
}

// pending reports whether fault f is planned for this delivery and has not struck yet.
func (r *invRun) pending(s *stored, attempt int, f fault) bool {
	if s.faults[attempt] != f {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.fired[[2]int{s.serial, attempt}]
}

// kill terminates the backend pid from the admin connection and waits
// until it is gone.
func (r *invRun) kill(pid uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.admin.Exec(ctx, `SELECT pg_terminate_backend($1, 5000)`, int64(pid)); err != nil {
		r.t.Logf("terminating backend %d: %v", pid, err)
	}
}

// killAll terminates every backend of the consumer's pool, at whatever
// each is doing.
func (r *invRun) killAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1`, r.app); err != nil {
		r.t.Logf("terminating the pool's backends: %v", err)
	}
}

// beforeCommit strikes at the COMMIT of a batch that holds a delivery with
// a killCommit or dropCommit fault. A kill terminates the backend a planned
// 0-3 ms from now: before, during (the stalled deferred trigger) or after
// the COMMIT. A drop closes the consumer's end of the connection as soon as
// the COMMIT is written.
func (r *invRun) beforeCommit(ctx context.Context, tx pgx.Tx, b *consumer.Batch) error {
	for _, m := range b.Messages {
		s := r.storedOf(m)
		if s == nil {
			continue
		}
		kill := r.strike(s, m.Attempt, killCommit)
		if !kill && !r.strike(s, m.Attempt, dropCommit) {
			continue
		}
		var xid string
		if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
			return err
		}
		r.mu.Lock()
		r.commitKills[b.Lane] = append(r.commitKills[b.Lane], &commitKill{xid: xid})
		r.mu.Unlock()
		if !kill {
			if dc, ok := tx.Conn().PgConn().Conn().(*dropConn); ok {
				dc.armed.Store(true)
			} else {
				r.t.Errorf("the consumer's connection is a %T, not a *dropConn", tx.Conn().PgConn().Conn())
			}
			return nil
		}
		pid := tx.Conn().PgConn().PID()
		r.kills.Add(1)
		go func() {
			defer r.kills.Done()
			time.Sleep(time.Duration(s.delay) * time.Microsecond)
			r.kill(pid)
		}()
		return nil
	}
	return nil
}

// dropConn is a client connection that, once armed, closes itself right
// after it wrote a COMMIT: the server receives the COMMIT and commits, and
// the client never hears so.
type dropConn struct {
	net.Conn
	armed atomic.Bool
}

func (c *dropConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if c.armed.Load() && bytes.Contains(bytes.ToLower(b), []byte("commit")) {
		c.armed.Store(false)
		c.Conn.Close()
	}
	return n, err
}

// settleCommitKills classifies the kills aimed at a COMMIT by what became
// of their transaction.
func (r *invRun) settleCommitKills(ctx context.Context) {
	for _, ks := range r.commitKills {
		for _, k := range ks {
			var status *string
			if err := r.admin.QueryRow(ctx, `SELECT pg_xact_status($1::text::xid8)`, k.xid).Scan(&status); err != nil {
				r.t.Errorf("status of transaction %s: %v", k.xid, err)
				continue
			}
			if status != nil && *status == "committed" {
				r.stats.commitKilledButCommitted++
				if k.reportErr {
					r.stats.unknownOutcome++
				}
			}
		}
	}
}
