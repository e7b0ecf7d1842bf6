package outbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LogRelay defaults.
const (
	// DefaultStatusInterval is the default LogRelayConfig.StatusInterval.
	DefaultStatusInterval = time.Second
	// DefaultStandbyRetry is the default LogRelayConfig.StandbyRetry.
	DefaultStandbyRetry = time.Second
	// DefaultLogCleanupInterval is the default LogRelayConfig.CleanupInterval.
	DefaultLogCleanupInterval = 10 * time.Second
)

// LogRelayConfig configures a LogRelay.
type LogRelayConfig struct {
	// Schema and Table name the outbox, as in Config. Default to
	// DefaultSchema and DefaultTable.
	Schema, Table string
	// Sinks maps the sink names messages give to where they go. Required.
	// A message to a sink not listed here is parked.
	Sinks map[string]Sink
	// Slot is the logical replication slot the relays of one group share:
	// one of them reads it at a time, the others stand by. Lower-case
	// letters, digits and underscores, at most 63. Defaults to
	// "effectively_outbox_" and a hash of the database, schema and table.
	Slot string
	// Publication is the publication of the outbox table's inserts that
	// the slot decodes; the relay creates it when it does not exist.
	// Defaults to Slot.
	Publication string
	// Owner names this relay in its logs and stats. Defaults to the host
	// name, the process ID and a random suffix.
	Owner string
	// BatchSize is the most messages one Publish call carries. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// StatusInterval is how often the relay tells the server how far it
	// has published (the slot's confirmed position) and answers its
	// keepalives. Defaults to DefaultStatusInterval.
	StatusInterval time.Duration
	// StandbyRetry is how often a standing-by relay tries to take the slot
	// over. Defaults to DefaultStandbyRetry.
	StandbyRetry time.Duration
	// PollInterval is how often the relay looks for redriven messages.
	// Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// MinBackoff and MaxBackoff bound the wait before a message that failed
	// transiently is tried again; the wait doubles with each attempt.
	// Default to DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// CleanupInterval is how often the cleanup deletes the rows the slot
	// has confirmed. Defaults to DefaultLogCleanupInterval.
	CleanupInterval time.Duration
	// CleanupBatch is the width of the id range one DELETE covers.
	// Defaults to 10 * DefaultCleanupBatch.
	CleanupBatch int
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Redact, when set, decides what a parked row keeps of its message, as
	// RelayConfig.Redact does; this relay also parks the later messages of
	// a parked message's key, and they are redacted alike. A Redact that
	// fails on one of those holds the relay (logged at error level, tried
	// again after a backoff) until it is fixed. Defaults to nil: a parked
	// row keeps the message as emitted.
	Redact func(Message) Message
	// Hooks observe the relay: PassDone after each batch published (Read
	// is the batch's size; CommitToPublish is measured from the commit).
	// A hook that implements LogHook gets the slot's events and lag too.
	// Defaults to none.
	Hooks []RelayHook
	// LagInterval is how often the relay reads the slot's lag for the
	// hooks that implement LogHook. Defaults to DefaultBacklogInterval.
	LagInterval time.Duration

	// Hooks for the package's tests; nil in use.
	afterPublish func(rows []row) error
}

var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

func (c *LogRelayConfig) defaults(database string) error {
	set := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if err := checkNames(c.Schema, c.Table); err != nil {
		return err
	}
	if c.Slot == "" {
		h := fnv.New64a()
		for _, s := range []string{database, c.Schema, c.Table} {
			h.Write([]byte(s))
			h.Write([]byte{0})
		}
		c.Slot = fmt.Sprintf("effectively_outbox_%016x", h.Sum64())
	}
	if c.Publication == "" {
		c.Publication = c.Slot
	}
	if !slotName.MatchString(c.Slot) || !slotName.MatchString(c.Publication) {
		return errors.New("outbox: LogRelayConfig.Slot and Publication must be 1 to 63 lower-case letters, digits or underscores")
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	set(&c.StatusInterval, DefaultStatusInterval)
	set(&c.StandbyRetry, DefaultStandbyRetry)
	set(&c.PollInterval, DefaultPollInterval)
	set(&c.MinBackoff, DefaultMinBackoff)
	set(&c.MaxBackoff, DefaultMaxBackoff)
	set(&c.CleanupInterval, DefaultLogCleanupInterval)
	set(&c.LagInterval, DefaultBacklogInterval)
	if c.CleanupBatch == 0 {
		c.CleanupBatch = 10 * DefaultCleanupBatch
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.BatchSize < 0, c.CleanupBatch < 0, c.StatusInterval < 0, c.StandbyRetry < 0, c.PollInterval < 0,
		c.CleanupInterval < 0, c.LagInterval < 0:
		return errors.New("outbox: LogRelayConfig has a negative size or duration")
	case c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff:
		return errors.New("outbox: LogRelayConfig.MaxBackoff must be at least MinBackoff, which must not be negative")
	}
	return nil
}

// LogRelay publishes the outbox's messages as PostgreSQL's logical
// replication stream delivers the transactions that emitted them: in
// commit order, with no cursor, no per-row mark and no per-key counter
// read. Its position is its replication slot's confirmed LSN, which it
// advances only once the sinks acknowledged every message before it.
//
// Run several for availability: one reads the slot, the others stand by
// and take over when it stops. A LogRelay needs wal_level = logical and a
// role with the REPLICATION attribute, over a direct connection (not
// through PgBouncer); use Relay where that is not possible. Never run a
// Relay and a LogRelay on one outbox: the LogRelay marks nothing
// published, so the Relay would publish everything again. See
// docs/pipelines.md.
type LogRelay struct {
	pool  *pgxpool.Pool
	cfg   LogRelayConfig
	t     tables
	log   *slog.Logger
	hooks hooks
	logh  []LogHook
	pub   *Relay // publishes and classifies outcomes as a Relay does
	repl  *pgconn.Config
	lock  int64 // advisory lock key fencing the slot's recovery

	// confirmed is the LSN up to which every committed message was
	// published (or parked): what the slot may confirm.
	confirmed atomic.Uint64
	// created is set once this relay has seen the slot exist, so that a
	// slot found missing later is reported as lost.
	seen bool

	mu      sync.Mutex
	stats   LogStats
	waiting []pendingCommit // commits received, not yet confirmed, oldest first

	// Owned by the goroutine publishing.
	held map[string]bool // keys with a parked message: their later messages park behind it
}

// pendingCommit is a commit the relay received and has not confirmed.
type pendingCommit struct {
	end LSN
	at  time.Time
}

// LSN is a position in PostgreSQL's write-ahead log.
type LSN = pglogrepl.LSN

// NewLogRelay returns a LogRelay reading the outbox of pool's database.
// The replication connection uses pool's connection settings with
// replication=database.
func NewLogRelay(pool *pgxpool.Pool, cfg LogRelayConfig) (*LogRelay, error) {
	if pool == nil {
		return nil, errors.New("outbox: NewLogRelay: nil pool")
	}
	cc := pool.Config().ConnConfig
	if err := cfg.defaults(cc.Database); err != nil {
		return nil, err
	}
	pub, err := NewRelay(pool, RelayConfig{Schema: cfg.Schema, Table: cfg.Table, Sinks: cfg.Sinks, Owner: cfg.Owner,
		BatchSize: cfg.BatchSize, MinBackoff: cfg.MinBackoff, MaxBackoff: cfg.MaxBackoff, Logger: cfg.Logger, Redact: cfg.Redact})
	if err != nil {
		return nil, err
	}
	cfg.Owner = pub.owner
	pub.byCommit = true // the stream orders keyed rows without a seq
	repl := cc.Config.Copy()
	if repl.RuntimeParams == nil {
		repl.RuntimeParams = map[string]string{}
	}
	repl.RuntimeParams["replication"] = "database"
	// The stream waits for messages under deadlines: a deadline must only
	// interrupt the read, never cancel the walsender's work.
	repl.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	h := fnv.New64a()
	h.Write([]byte("effectively outbox slot " + cfg.Slot))
	r := &LogRelay{pool: pool, cfg: cfg, t: newTables(cfg.Schema, cfg.Table), log: cfg.Logger,
		hooks: newHooks(cfg.Hooks), pub: pub, repl: repl, lock: int64(h.Sum64()), held: map[string]bool{}}
	for _, x := range cfg.Hooks {
		if l, ok := x.(LogHook); ok {
			r.logh = append(r.logh, l)
		}
	}
	r.stats.Slot, r.stats.Owner = cfg.Slot, cfg.Owner
	return r, nil
}

// errStandby: another relay reads the slot.
var errStandby = errors.New("outbox: another relay reads the slot")

// Run publishes until ctx is done, then finishes the batch in progress,
// confirms what it published and returns nil. While another relay reads
// the slot, it stands by and tries again every StandbyRetry. It returns an
// error only when it cannot go on (the server lacks logical decoding, the
// role may not replicate, a setting is wrong).
func (r *LogRelay) Run(ctx context.Context) error {
	cctx, stopCleanup := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.cleanupLoop(cctx) }()
	defer func() { stopCleanup(); wg.Wait() }()

	failures := 0
	standing := false
	for {
		err := r.session(ctx)
		r.setActive(false)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errCrash) {
			return err
		}
		if fatal(err) {
			return fmt.Errorf("outbox: log relay: %w", err)
		}
		wait := r.cfg.StandbyRetry
		if standby(err) {
			if !standing {
				r.log.Info("outbox: another relay reads the slot; standing by to take over", "slot", r.cfg.Slot, "owner", r.cfg.Owner, "retry", r.cfg.StandbyRetry)
			}
			standing, failures = true, 0
		} else {
			standing = false
			failures++
			wait = backoff(r.cfg.MinBackoff, r.cfg.MaxBackoff, failures)
			r.log.Warn("outbox: log relay lost its stream; reconnecting and resuming from the slot's confirmed position (messages after it are published again, with the same IDs)",
				"slot", r.cfg.Slot, "owner", r.cfg.Owner, "in", wait, "err", err)
			r.count(func(s *LogStats) { s.Reconnects++ })
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// standby reports whether err means another relay holds the slot.
func standby(err error) bool {
	var pe *pgconn.PgError
	return errors.Is(err, errStandby) || errors.As(err, &pe) && pe.Code == "55006" // object_in_use: slot active for another PID
}

// fatal reports whether err is a configuration the relay cannot overcome
// by trying again.
func fatal(err error) bool {
	var elsewhere *slotElsewhereError
	if errors.As(err, &elsewhere) {
		return true
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "42501", "28000": // insufficient_privilege, invalid_authorization_specification (no REPLICATION)
		return true
	case "55000": // object_not_in_prerequisite_state: wal_level below logical, or an invalidated slot
		return !slotInvalidated(pe)
	}
	return false
}

// session takes the slot, recovers what a new slot cannot deliver, and
// streams until ctx is done or the stream fails.
func (r *LogRelay) session(ctx context.Context) error {
	if err := r.ensurePublication(ctx); err != nil {
		return err
	}
	lc, err := r.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer func() {
		// The lock is the connection's: closing it frees the lock whatever
		// state the session ended in.
		_ = lc.Conn().Close(context.Background())
		lc.Release()
	}()
	var got bool
	if err := lc.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, r.lock).Scan(&got); err != nil {
		return err
	}
	if !got {
		return errStandby
	}
	conn, err := pgconn.ConnectConfig(ctx, r.repl)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	start, err := r.prepareSlot(ctx, conn)
	if err != nil {
		return err
	}
	err = pglogrepl.StartReplication(ctx, conn, r.cfg.Slot, start, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + r.cfg.Publication + "'",
			"binary 'true'"},
	})
	if err != nil {
		return err
	}
	r.setActive(true)
	r.log.Info("outbox: log relay reading its slot", "slot", r.cfg.Slot, "owner", r.cfg.Owner, "from", LSN(r.confirmed.Load()))
	return r.stream(ctx, conn)
}

// advance raises the confirmed position to lsn, never lowering it, and
// forgets the commits it covers.
func (r *LogRelay) advance(lsn LSN) {
	for {
		cur := r.confirmed.Load()
		if uint64(lsn) <= cur || r.confirmed.CompareAndSwap(cur, uint64(lsn)) {
			break
		}
	}
	r.mu.Lock()
	i := 0
	for i < len(r.waiting) && r.waiting[i].end <= lsn {
		i++
	}
	r.waiting = r.waiting[i:]
	r.stats.Confirmed = LSN(r.confirmed.Load())
	r.mu.Unlock()
}

func (r *LogRelay) setActive(active bool) {
	r.count(func(s *LogStats) { s.Active = active })
}

func (r *LogRelay) count(f func(*LogStats)) {
	r.mu.Lock()
	f(&r.stats)
	r.mu.Unlock()
}

// Stats returns the relay's counters and state.
func (r *LogRelay) Stats() LogStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	if len(r.waiting) > 0 {
		s.OldestUnconfirmed = time.Since(r.waiting[0].at)
	}
	return s
}
