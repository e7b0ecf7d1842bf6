package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Relay defaults.
const (
	DefaultBatchSize    = 500
	DefaultLeaseTTL     = 10 * time.Second
	DefaultPollInterval = time.Second
	DefaultMinBackoff   = 100 * time.Millisecond
	DefaultMaxBackoff   = 30 * time.Second
	DefaultRetention    = 24 * time.Hour
	DefaultCleanupBatch = 1000
	// DefaultBacklogInterval is the default RelayConfig.BacklogInterval.
	DefaultBacklogInterval = 15 * time.Second
)

// DeleteOnPublish, as RelayConfig.Retention, keeps no published row: the
// relay deletes each as it marks it published.
const DeleteOnPublish time.Duration = -1

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Schema and Table name the outbox, as in Config. Default to
	// DefaultSchema and DefaultTable.
	Schema, Table string
	// Sinks maps the sink names messages give to where they go. Required.
	// A message to a sink not listed here is parked.
	Sinks map[string]Sink
	// Owner names this relay in the leases table. Defaults to the host
	// name, the process ID and a random suffix.
	Owner string
	// BatchSize is the most rows one pass reads and publishes. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// LeaseTTL is how long a partition lease lasts without renewal; the
	// relay renews every third of it. Defaults to DefaultLeaseTTL.
	LeaseTTL time.Duration
	// LeaseMargin is how long before its lease's expiry (by its own clock)
	// a relay stops publishing for the partition. It covers clock rate
	// differences and the time a publish takes. Defaults to LeaseTTL / 4.
	LeaseMargin time.Duration
	// PollInterval is how often the relay looks for work without a
	// notification. Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// PollOnly turns LISTEN off, for connections through PgBouncer in
	// transaction pooling mode. LISTEN also needs a db with
	// Acquire (a *pgxpool.Pool); without it the relay polls. Defaults to
	// false. Run checks at start-up for a pooler (pg.CheckPooling):
	// it refuses a pool whose prepared statements cannot cross a
	// transaction pooler (pg.ErrTransactionPooling), and without
	// PollOnly behind one it warns and polls.
	PollOnly bool
	// MinBackoff and MaxBackoff bound the wait before a message that failed
	// transiently is tried again; the wait doubles with each attempt.
	// Default to DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Retention is how long published rows are kept before the cleanup
	// deletes them. Defaults to DefaultRetention. DeleteOnPublish deletes
	// each row as its publish is marked: the relay's cheapest setting (a
	// delete writes less than the update that keeps the row), for outboxes
	// whose published rows nobody reads.
	Retention time.Duration
	// CleanupInterval is how often the cleanup runs. Defaults to Retention
	// / 10, at most an hour.
	CleanupInterval time.Duration
	// CleanupBatch is the most rows one DELETE removes. Defaults to
	// DefaultCleanupBatch.
	CleanupBatch int
	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Hooks observe the relay, for metrics and tracing (see RelayHook).
	// Defaults to none.
	Hooks []RelayHook
	// BacklogInterval is how often the relay reads the outbox's backlog
	// for the hooks that implement BacklogHook; without one it never does.
	// Defaults to DefaultBacklogInterval.
	BacklogInterval time.Duration
	// Redact, when set, is called with a copy of every message the relay
	// parks (refused for good by its sink, or to a sink not in Sinks), and
	// the parked row keeps the Value and Headers it returns instead of the
	// message's, written by the statement that parks it: what it removes
	// or masks is never at rest in a parked row, nor shown by Parked or
	// `effectively outbox list`, and a redrive publishes what it returned.
	// Sink, Key and ID are kept whatever it returns (the key's order and
	// the ID the next stage dedupes by). A Redact that panics, or returns
	// a header no message may carry, leaves the message unparked: logged
	// at error level and tried again after a backoff, as after a
	// transient failure, holding its key. Messages waiting to be published
	// are not redacted. The relay logs no value or header value of a
	// message: its lines name the sink, the ID and the sink's error.
	// Defaults to nil: a parked row keeps the message as emitted.
	Redact func(Message) Message

	// Hooks for the package's tests; nil in use.
	now          func() time.Time
	beforeCheck  func()
	afterPublish func(rows []row) error
	onListen     func()
}

func (c *RelayConfig) defaults() error {
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
	if len(c.Sinks) == 0 {
		return errors.New("outbox: RelayConfig.Sinks is required")
	}
	for name, s := range c.Sinks {
		if s == nil {
			return fmt.Errorf("outbox: RelayConfig.Sinks[%q] is nil", name)
		}
	}
	if c.Owner == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		c.Owner = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	set(&c.LeaseTTL, DefaultLeaseTTL)
	set(&c.LeaseMargin, c.LeaseTTL/4)
	set(&c.PollInterval, DefaultPollInterval)
	set(&c.MinBackoff, DefaultMinBackoff)
	set(&c.MaxBackoff, DefaultMaxBackoff)
	set(&c.Retention, DefaultRetention)
	set(&c.CleanupInterval, min(max(c.Retention/10, time.Minute), time.Hour))
	set(&c.BacklogInterval, DefaultBacklogInterval)
	if c.CleanupBatch == 0 {
		c.CleanupBatch = DefaultCleanupBatch
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.now == nil {
		c.now = time.Now
	}
	switch {
	case c.BatchSize < 0, c.CleanupBatch < 0, c.PollInterval < 0, c.Retention < 0 && c.Retention != DeleteOnPublish, c.CleanupInterval <= 0, c.BacklogInterval < 0:
		return errors.New("outbox: RelayConfig has a negative size or duration")
	case c.LeaseMargin < 0 || c.LeaseMargin >= c.LeaseTTL:
		return errors.New("outbox: RelayConfig.LeaseMargin must be at least 0 and less than LeaseTTL")
	case c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff:
		return errors.New("outbox: RelayConfig.MaxBackoff must be at least MinBackoff, which must not be negative")
	}
	return nil
}

// Relay publishes committed outbox rows to their sinks. Run several, in
// one process or many: each publishes the partitions it leases.
type Relay struct {
	db    pg.DB
	cfg   RelayConfig
	t     tables
	owner string
	log   *slog.Logger
	now   func() time.Time
	hooks hooks

	mu     sync.Mutex
	leases map[int32]lease

	// byCommit is set when the relay publishes for a LogRelay, whose rows
	// come in commit order: a keyed row without a seq (LogMode) is then
	// in order, not parked.
	byCommit bool

	// Owned by the goroutine running Run.
	turn    int   // where the next fetch starts among the partitions
	perPart int   // the most rows a fetch reads of one partition
	pipe    batch // the batch published and not yet marked, if any
	ahead   batch // the batch read ahead, not yet published, if any
}

// NewRelay returns a Relay over db, which should be a pool: the relay
// commits its own work.
func NewRelay(db pg.DB, cfg RelayConfig) (*Relay, error) {
	if db == nil {
		return nil, errors.New("outbox: NewRelay: nil db")
	}
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	return &Relay{db: db, cfg: cfg, t: newTables(cfg.Schema, cfg.Table), owner: cfg.Owner,
		log: cfg.Logger, now: cfg.now, hooks: newHooks(cfg.Hooks), leases: map[int32]lease{}}, nil
}

// errCrash, returned by a test hook, makes Run return at once, as a crash
// would: no marking, no release of leases.
var errCrash = errors.New("outbox: simulated crash")

// Run publishes until ctx is done, then finishes the pass in progress
// (what was published is marked), gives its leases back and returns nil.
// It returns an error only when it cannot go on.
func (r *Relay) Run(ctx context.Context) error {
	listen, err := r.checkPooling(ctx)
	if err != nil {
		return err
	}
	wake := make(chan struct{}, 1)
	lctx, stopListen := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if acq := pg.Pool(r.db); acq != nil && listen {
		wg.Add(1)
		go func() { defer wg.Done(); r.listen(lctx, acq.Acquire, wake) }()
	}
	defer func() { stopListen(); wg.Wait() }()

	poll := time.NewTimer(0)
	defer poll.Stop()
	var nextLease, nextCleanup, nextBacklog, nextAdopt time.Time
	failures := 0
	for {
		if ctx.Err() != nil {
			return r.shutdown()
		}
		if !time.Now().Before(nextLease) {
			if err := r.tickLeases(ctx); err != nil {
				if ctx.Err() != nil {
					continue
				}
				r.log.Warn("outbox: leases", "owner", r.owner, "err", err)
			}
			nextLease = time.Now().Add(r.cfg.LeaseTTL / 3)
		}
		if !time.Now().Before(nextCleanup) {
			parts, _ := r.held()
			if n, err := r.cleanup(ctx, parts); err != nil && ctx.Err() == nil {
				r.log.Warn("outbox: cleanup", "err", err)
			} else if n > 0 {
				r.log.Debug("outbox: cleanup", "deleted", n)
			}
			if n, err := r.pruneCounters(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("outbox: cleanup", "err", err)
			} else if n > 0 {
				r.log.Debug("outbox: cleanup", "counters deleted", n)
			}
			nextCleanup = time.Now().Add(r.cfg.CleanupInterval)
		}
		if len(r.hooks.backlog) > 0 && !time.Now().Before(nextBacklog) {
			if err := r.reportBacklog(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("outbox: backlog", "err", err)
			}
			nextBacklog = time.Now().Add(r.cfg.BacklogInterval)
		}
		if !time.Now().Before(nextAdopt) {
			if _, err := r.adoptLog(ctx); err != nil && ctx.Err() == nil {
				r.log.Warn("outbox: relay", "owner", r.owner, "err", err)
			}
			nextAdopt = time.Now().Add(r.cfg.PollInterval)
		}
		_, more, err := r.pass(ctx)
		if errors.Is(err, errCrash) {
			return err
		}
		if err != nil && ctx.Err() == nil {
			failures++
			r.log.Warn("outbox: relay pass", "owner", r.owner, "err", err)
			d := backoff(r.cfg.MinBackoff, r.cfg.MaxBackoff, failures)
			r.wait(ctx, wake, poll, min(d, time.Until(nextLease)))
			continue
		}
		failures = 0
		if more {
			continue
		}
		r.wait(ctx, wake, poll, min(r.cfg.PollInterval, time.Until(nextLease)))
	}
}

// wait returns on a notification, after d, or when ctx is done, and tells
// the hooks what woke it.
func (r *Relay) wait(ctx context.Context, wake <-chan struct{}, t *time.Timer, d time.Duration) {
	t.Reset(max(d, 0))
	select {
	case <-ctx.Done():
	case <-wake:
		r.woke(ctx, WakeNotify)
	case <-t.C:
		r.woke(ctx, WakePoll)
	}
}

func (r *Relay) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.LeaseTTL)
	defer cancel()
	r.ahead = batch{}
	if err := r.mark(ctx); err != nil {
		r.log.Warn("outbox: shutdown", "err", err)
	}
	parts, gens := r.held()
	if err := r.release(ctx, parts, gens); err != nil {
		r.log.Warn("outbox: shutdown", "err", err)
	} else {
		r.leasesChanged(ctx, LeaseEvent{Released: len(parts)})
	}
	if _, err := r.db.Exec(ctx, `DELETE FROM `+r.t.relays+` WHERE owner = $1`, r.owner); err != nil {
		r.log.Warn("outbox: shutdown", "err", err)
	}
	r.mu.Lock()
	r.leases = map[int32]lease{}
	r.mu.Unlock()
	return nil
}

// checkPooling looks, at start-up, for a pooler between the relay and the
// server (pg.CheckPooling). Behind a transaction pooler it refuses pgx
// settings whose prepared statements cannot cross it and, unless
// PollOnly, warns that LISTEN cannot work there and reports that the relay
// must poll. A failed check is logged and the relay goes on as configured.
func (r *Relay) checkPooling(ctx context.Context) (listen bool, err error) {
	p, err := pg.CheckPooling(ctx, r.db)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("outbox: cannot check for a connection pooler; going on as configured", "err", err)
		}
		return !r.cfg.PollOnly, nil
	}
	if err := p.Err(); err != nil {
		return false, fmt.Errorf("outbox: relay: %w", err)
	}
	if w := p.Warning(); w != "" {
		r.log.Warn("outbox: " + w)
	}
	if r.cfg.PollOnly {
		return false, nil
	}
	if p.Transaction {
		r.log.Warn("outbox: the connections go through a pooler in transaction mode (PgBouncer pool_mode = transaction), where LISTEN cannot work: "+
			"the relay polls instead, every PollInterval; set RelayConfig.PollOnly = true to say so, or give the relay a pool with a direct or session-pooled connection to be woken by NOTIFY",
			"poll_interval", r.cfg.PollInterval)
		return false, nil
	}
	return true, nil
}

// listen delivers a wake-up for every notification on the outbox's
// channel, reconnecting after a failure.
func (r *Relay) listen(ctx context.Context, acquire func(context.Context) (*pgxpool.Conn, error), wake chan<- struct{}) {
	for ctx.Err() == nil {
		err := func() error {
			c, err := acquire(ctx)
			if err != nil {
				return err
			}
			defer func() {
				// The connection is LISTENing: close it rather than return it to the pool.
				_ = c.Conn().Close(context.Background())
				c.Release()
			}()
			if _, err := c.Exec(ctx, `LISTEN `+pgx.Identifier{r.t.channel}.Sanitize()); err != nil {
				return err
			}
			if r.cfg.onListen != nil {
				r.cfg.onListen()
			}
			for {
				if _, err := c.Conn().WaitForNotification(ctx); err != nil {
					return err
				}
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		}()
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("outbox: listen", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(r.cfg.PollInterval):
		}
	}
}

// backoff is min * 2^(attempt-1), capped at max, less up to a quarter of jitter.
func backoff(minD, maxD time.Duration, attempt int) time.Duration {
	d := minD
	for i := 1; i < attempt && d < maxD; i++ {
		d *= 2
	}
	d = min(d, maxD)
	var b [1]byte
	_, _ = rand.Read(b[:])
	return d - d/4*time.Duration(b[0])/255
}
