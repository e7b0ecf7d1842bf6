// Package standby holds a consumer's batches, after their COMMIT, until
// the commit is on enough of the primary's streaming standbys, so that a
// failover to an asynchronous standby loses nothing that was acknowledged
// (consumer.Config.StandbyAck; see docs/failover.md). One Poller serves
// every waiting batch of a consumer, with one query per poll whatever the
// number of lanes waiting.
package standby

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/effectively-once/effectively/pg"
)

// Config makes the consumer acknowledge a batch to its source only once
// the batch's commit is on enough standbys, so that a failover to an
// asynchronous standby loses nothing that was acknowledged (see
// docs/failover.md). The zero value leaves it off.
//
// After COMMIT, the batch waits until the primary's pg_stat_replication
// shows at least Standbys standbys past the commit's position. One poller
// serves every waiting batch of the consumer, with one query per poll
// whatever the number of lanes waiting, and no round trip per message or
// per batch. The consumer's role must be able to read the standbys'
// positions there (a superuser, or a member of pg_monitor or
// pg_read_all_stats): the consumer's Run refuses to start otherwise.
//
// A batch's commit position is taken as the primary's WAL flush position
// read after its COMMIT returned (the commit flushed its record before
// returning), or its insert position when the consumer's sessions run
// with synchronous_commit = off (read at start-up). A handler that turns
// synchronous_commit off for its own transaction (SET LOCAL) makes the
// wait end before the standbys have the commit: don't.
//
// A batch whose commit no standby confirms within Timeout, while the
// primary answers, is acknowledged anyway, logged at WARN and counted
// (consumer.BatchStats.StandbyUnconfirmed): a failover now could lose it. A batch
// that cannot be confirmed because the primary changed while it waited (a
// failover, or a restart) or could not be asked until Timeout is handed
// back to the source unacknowledged (consumer.BatchStats.Err matches
// ErrUnconfirmed): it is delivered again, a duplicate if its commit
// survived.
type Config struct {
	// Standbys is how many standbys must hold a batch's commit before the
	// batch is acknowledged. Only standbys streaming from the primary
	// count (a cascaded standby counts through the one it streams from),
	// and logical replication clients never do. Defaults to 0: the setting
	// is off and a batch is acknowledged once its COMMIT returned.
	Standbys int
	// Replayed waits until the standbys have replayed the commit
	// (pg_stat_replication.replay_lsn), so that queries on them see it,
	// rather than flushed it to disk (flush_lsn), which is what a
	// promotion keeps. Defaults to false: flushed.
	Replayed bool
	// Timeout bounds the wait of one batch. Defaults to 10s
	// (DefaultTimeout).
	Timeout time.Duration
}

// DefaultTimeout is the default of Config.Timeout.
const DefaultTimeout = 10 * time.Second

// ErrUnconfirmed is matched by consumer.BatchStats.Err of a batch that
// committed but was handed back to its source unacknowledged, because no
// standby could confirm its commit: the primary changed while the batch
// waited (a failover or a restart), or could not be asked within
// Config.Timeout. Its messages are delivered again: duplicates if the
// commit survived, applied again if it was lost.
var ErrUnconfirmed = errors.New("consumer: commit not confirmed by the standbys; batch handed back to the source")

// ErrPrivilege is matched by the error consumer.Consumer.Run returns when
// Config is on and the consumer's role cannot read the standbys'
// positions in pg_stat_replication.
var ErrPrivilege = errors.New("consumer: StandbyAck needs to read pg_stat_replication")

// Polling: the first poll for a newly waiting batch is sent at once when
// the poller is idle; while batches wait, polls follow each other after
// standbyPollMin, growing by as much after each poll that confirms none,
// up to standbyPollMax.
// A poll that gets no answer within standbyPollTimeout fails.
var (
	standbyPollMin     = time.Millisecond
	standbyPollMax     = 10 * time.Millisecond
	standbyPollTimeout = 2 * time.Second
)

// serverID tells servers apart: the WAL timeline (a promotion starts a new
// one) and the postmaster's start time (a restart, or another server on
// the same timeline).
type serverID struct {
	timeline string
	started  time.Time
}

func (s serverID) String() string {
	return "timeline " + strings.TrimLeft(s.timeline, "0") + ", started " + s.started.Format(time.RFC3339)
}

// standbyPoll is what one poll read on the primary.
type standbyPoll struct {
	id        serverID
	insert    uint64   // pg_current_wal_insert_lsn()
	flush     uint64   // pg_current_wal_flush_lsn()
	positions []uint64 // the standbys' flush (or replay) positions
}

// confirming counts the positions at or past lsn.
func (p *standbyPoll) confirming(lsn uint64) int {
	n := 0
	for _, pos := range p.positions {
		if pos >= lsn {
			n++
		}
	}
	return n
}

// standbyVerdict is how a batch's wait ended.
type standbyVerdict uint8

const (
	standbyConfirmed   standbyVerdict = iota + 1
	standbyTimedOut                   // acknowledged unconfirmed
	standbyChanged                    // the primary changed: handed back
	standbyUnreachable                // no answer until Timeout: handed back
)

// Result is how one batch's wait ended.
type Result struct {
	verdict standbyVerdict
	// Confirmed is how many standbys were past the commit at the last
	// poll.
	Confirmed int
	target    uint64
	was, is   serverID
	lastErr   error
}

// TimedOut reports whether the batch is acknowledged although fewer
// standbys than required confirmed its commit within Config.Timeout.
func (r Result) TimedOut() bool { return r.verdict == standbyTimedOut }

// standbyWait is one batch waiting.
type standbyWait struct {
	since    serverID // the server the last poll before the batch's commit saw
	target   uint64   // 0 until a poll after the commit read the insert position
	on       serverID // the server target was read on
	deadline time.Time
	done     chan Result
}

// Poller is the poller shared by a consumer's batches: Wait holds one
// batch, after its COMMIT returned, until the commit is on the standbys.
type Poller struct {
	db  pg.DB
	cfg Config
	sql string

	// insert takes the primary's insert position for a batch's target,
	// rather than its flush position: a COMMIT with synchronous_commit =
	// off returns before its commit record is flushed.
	insert bool

	mu      sync.Mutex
	waiting []*standbyWait
	server  serverID // as the last successful poll saw it
	lastErr error    // of the last poll, nil when it succeeded
	polling bool     // the poller goroutine runs
}

// New returns the Poller of a consumer whose Config is cfg (Standbys > 0,
// Timeout set).
func New(db pg.DB, cfg Config) *Poller {
	col := "flush_lsn"
	if cfg.Replayed {
		col = "replay_lsn"
	}
	// Logical replication clients (a log-based outbox relay, say) stream
	// from the primary too, and report positions, but are no standbys.
	return &Poller{db: db, cfg: cfg, sql: `SELECT l::text, pg_current_wal_flush_lsn()::text, pg_walfile_name(l), pg_postmaster_start_time(),
  ARRAY(SELECT r.` + col + `::text FROM pg_stat_replication AS r
        WHERE r.` + col + ` IS NOT NULL AND r.state <> 'backup'
          AND r.pid NOT IN (SELECT s.active_pid FROM pg_replication_slots AS s
                            WHERE s.slot_type = 'logical' AND s.active_pid IS NOT NULL))
FROM pg_current_wal_insert_lsn() AS l`}
}

// poll reads the primary's insert position and its standbys' positions.
func (s *Poller) poll(ctx context.Context) (*standbyPoll, error) {
	ctx, cancel := context.WithTimeout(ctx, standbyPollTimeout)
	defer cancel()
	var insert, flush, walfile string
	var positions []string
	p := &standbyPoll{}
	if err := s.db.QueryRow(ctx, s.sql).Scan(&insert, &flush, &walfile, &p.id.started, &positions); err != nil {
		return nil, err
	}
	var err error
	if p.insert, err = parseLSN(insert); err != nil {
		return nil, err
	}
	if p.flush, err = parseLSN(flush); err != nil {
		return nil, err
	}
	p.id.timeline = walfile[:min(8, len(walfile))]
	for _, pos := range positions {
		lsn, err := parseLSN(pos)
		if err != nil {
			return nil, err
		}
		p.positions = append(p.positions, lsn)
	}
	return p, nil
}

// parseLSN parses a pg_lsn's text, "16/B374D848".
func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("consumer: cannot parse the WAL position %q", s)
	}
	return h<<32 | l, nil
}

// Check runs at start-up: the role must see the standbys' positions, and
// the first poll learns which server is the primary. It warns when fewer
// standbys than required stream now.
func (s *Poller) Check(ctx context.Context, log *slog.Logger) error {
	var allowed bool
	var role, syncCommit string
	err := s.db.QueryRow(ctx, `SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE'), current_user, current_setting('synchronous_commit')`).Scan(&allowed, &role, &syncCommit)
	if err != nil {
		return fmt.Errorf("consumer: StandbyAck: checking the role's privileges: %w", err)
	}
	s.insert = syncCommit == "off"
	if !allowed {
		return fmt.Errorf("%w: PostgreSQL shows the standbys' positions only to superusers and roles with the privileges of pg_read_all_stats, and role %q has neither (its standbys would look absent, and every batch would wait for StandbyAck.Timeout): GRANT pg_monitor TO %s (or pg_read_all_stats)",
			ErrPrivilege, role, quoteIdent(role))
	}
	p, err := s.poll(ctx)
	if err != nil {
		return fmt.Errorf("consumer: StandbyAck: reading pg_stat_replication: %w", err)
	}
	s.mu.Lock()
	s.server = p.id
	s.mu.Unlock()
	log.InfoContext(ctx, "acknowledging batches once their commit is on the standbys",
		"standbys_required", s.cfg.Standbys, "synchronous_commit", syncCommit, "standbys_streaming", len(p.positions), "replayed", s.cfg.Replayed, "timeout", s.cfg.Timeout, "primary", p.id.String())
	if len(p.positions) < s.cfg.Standbys {
		log.WarnContext(ctx, fmt.Sprintf("StandbyAck requires %d standbys and the primary has %d streaming: until more stream, every batch waits StandbyAck.Timeout and is then acknowledged unconfirmed, which a failover to an asynchronous standby could lose", s.cfg.Standbys, len(p.positions)),
			"standbys_required", s.cfg.Standbys, "standbys_streaming", len(p.positions), "timeout", s.cfg.Timeout)
	}
	return nil
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// Wait blocks until the commit that returned just before it was called
// is on enough standbys, or the wait ends otherwise (see Config). It
// returns nil when the batch is to be acknowledged (Result.TimedOut says
// whether unconfirmed), and an error matching ErrUnconfirmed when it is to
// be handed back.
func (s *Poller) Wait(ctx context.Context) (Result, error) {
	w := &standbyWait{deadline: time.Now().Add(s.cfg.Timeout), done: make(chan Result, 1)}
	s.mu.Lock()
	w.since = s.server
	s.waiting = append(s.waiting, w)
	if !s.polling {
		s.polling = true
		go s.run()
	}
	s.mu.Unlock()
	select {
	case r := <-w.done:
		switch r.verdict {
		case standbyChanged:
			return r, fmt.Errorf("%w: the primary changed while the batch waited (was %s, now %s)", ErrUnconfirmed, r.was, r.is)
		case standbyUnreachable:
			return r, fmt.Errorf("%w: the primary could not be asked within %s: %w", ErrUnconfirmed, s.cfg.Timeout, r.lastErr)
		}
		return r, nil
	case <-ctx.Done():
		s.mu.Lock()
		s.remove(w)
		s.mu.Unlock()
		select {
		case r := <-w.done: // decided meanwhile
			if r.verdict == standbyConfirmed || r.verdict == standbyTimedOut {
				return r, nil
			}
		default:
		}
		return Result{}, fmt.Errorf("%w: %w", ErrUnconfirmed, ctx.Err())
	}
}

// remove drops w from the waiting batches. s.mu is held.
func (s *Poller) remove(w *standbyWait) {
	for i, x := range s.waiting {
		if x == w {
			s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
			return
		}
	}
}

// run polls while batches wait, then returns.
func (s *Poller) run() {
	delay := standbyPollMin
	for {
		s.mu.Lock()
		if len(s.waiting) == 0 {
			s.polling = false
			s.mu.Unlock()
			return
		}
		batch := append([]*standbyWait(nil), s.waiting...)
		s.mu.Unlock()

		p, err := s.poll(context.Background())
		if s.decide(batch, p, err, time.Now()) > 0 {
			delay = standbyPollMin
		} else {
			delay = min(delay+standbyPollMin, standbyPollMax)
		}
		s.mu.Lock()
		waiting := len(s.waiting) > 0
		s.mu.Unlock()
		if waiting {
			time.Sleep(delay)
		}
	}
}

// decide settles the waits of batch that the poll p (or its failure err)
// decides, and returns how many it confirmed.
func (s *Poller) decide(batch []*standbyWait, p *standbyPoll, err error, now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastErr = err
	if err == nil {
		s.server = p.id
	}
	confirmed := 0
	for _, w := range batch {
		r, ok := s.judge(w, p, err, now)
		if !ok {
			continue
		}
		if r.verdict == standbyConfirmed {
			confirmed++
		}
		s.remove(w)
		w.done <- r
	}
	return confirmed
}

// judge decides w's wait from one poll, if the poll decides it.
func (s *Poller) judge(w *standbyWait, p *standbyPoll, err error, now time.Time) (Result, bool) {
	r := Result{target: w.target, lastErr: err}
	if err == nil {
		switch {
		case w.target == 0 && p.id != w.since:
			// The commit may have been on the server before this one.
			r.verdict, r.was, r.is = standbyChanged, w.since, p.id
			return r, true
		case w.target == 0:
			// This poll was sent after the commit returned: the primary's
			// flush position now is at or past the commit's end, since
			// COMMIT flushes its record before it returns, unless
			// synchronous_commit is off: then its insert position is.
			// (The insert position also takes in the WAL of the
			// transactions in progress, which are flushed only when they
			// commit: waiting for it would make a batch wait for the
			// batches of other lanes.)
			w.target, w.on = p.flush, p.id
			if s.insert {
				w.target = p.insert
			}
			r.target = w.target
		case p.id != w.on:
			r.verdict, r.was, r.is = standbyChanged, w.on, p.id
			return r, true
		}
		r.Confirmed = p.confirming(w.target)
		if r.Confirmed >= s.cfg.Standbys {
			r.verdict = standbyConfirmed
			return r, true
		}
	}
	if now.Before(w.deadline) {
		return r, false
	}
	if err == nil && w.target != 0 {
		r.verdict = standbyTimedOut
	} else {
		r.verdict = standbyUnreachable
		if r.lastErr == nil {
			r.lastErr = errors.New("no poll answered since the commit")
		}
	}
	return r, true
}
