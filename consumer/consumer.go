package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effectively-once/effectively/consumer/internal/merge"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/consumer/standby"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
)

// Consumer runs the loop: fetch a batch from a lane, claim its keys and run
// the handler in one transaction, commit, then acknowledge.
type Consumer struct {
	// path is the one path from a message's key to its handler, with the
	// capabilities of the strategy and the source, resolved by New.
	path

	db          pg.DB
	src         Source
	attempts    *attempts
	senders     *senders
	parkedTable string
	idleSQL     string // run after BEGIN in every batch transaction
	// idleTx is how long a batch transaction may stay idle before the
	// server ends its session: IdleTxTimeout, or the server's setting when
	// it is left in force. server holds the timeouts read at start-up.
	idleTx time.Duration
	server serverSettings
	// horizonChecked is false when the source could not say its redelivery
	// horizon at start-up: it is asked again in the background.
	horizonChecked bool

	merger merge.Merger // a QueueHandler's single-row INSERTs merged

	standbys *standby.Poller // nil unless Config.StandbyAck is on

	startHooks []BatchStartHook
	msgHooks   []MessageHook
	batches    atomic.Uint64 // numbers the batches: BatchInfo.Batch

	running atomic.Bool
}

// New returns a Consumer reading from src and writing through db. It fills
// cfg's defaults and returns an error wrapping ErrInvalidConfig for a bad value.
func New(db pg.DB, src Source, cfg Config) (*Consumer, error) {
	if db == nil {
		return nil, pg.ConfigErrorf("consumer", "db", "must not be nil")
	}
	if src == nil {
		return nil, pg.ConfigErrorf("consumer", "src", "must not be nil")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Consumer{
		db:          db,
		src:         src,
		path:        newPath(cfg, cfg.Logger.With("consumer", cfg.Name), src),
		parkedTable: pgx.Identifier{cfg.Schema, cfg.ParkedTable}.Sanitize(),
		idleSQL:     idleSQL(cfg.IdleTxTimeout),
		idleTx:      max(cfg.IdleTxTimeout, 0),
		attempts:    newAttempts(),
		senders:     newSenders(),
	}
	if cfg.StandbyAck.Standbys > 0 {
		c.standbys = standby.New(db, cfg.StandbyAck)
	}
	for _, h := range cfg.Hooks {
		if sh, ok := h.(BatchStartHook); ok {
			c.startHooks = append(c.startHooks, sh)
		}
		if mh, ok := h.(MessageHook); ok {
			c.msgHooks = append(c.msgHooks, mh)
		}
	}
	return c, nil
}

// Config returns the consumer's configuration with defaults filled in.
func (c *Consumer) Config() Config { return c.cfg }

// Migrations returns the migration lines the consumer needs: the parked
// table and, if the strategy or the source owns tables (markers, Kafka
// offsets), theirs.
func (c *Consumer) Migrations() []pg.Line {
	lines := []pg.Line{parked.Line(c.cfg.Schema, c.cfg.ParkedTable)}
	if c.migrator != nil {
		lines = append(lines, c.migrator.Migrations()...)
	}
	if c.srcMigrator != nil {
		lines = append(lines, c.srcMigrator.Migrations()...)
	}
	return lines
}

// Migrate applies the migrations of Migrations that are not yet applied.
func (c *Consumer) Migrate(ctx context.Context) error {
	applied, err := pg.Migrate(ctx, c.db, c.cfg.Schema, c.Migrations()...)
	for _, m := range applied {
		c.log.Info("applied migration", "line", m.Line, "version", m.Version, "name", m.Name)
	}
	return err
}

// Run processes messages until ctx is done, then lets in-flight batches
// commit or roll back and settles them with the source, and returns nil.
//
// Run returns an error when it cannot go on: the consumer's tables are
// missing or the database cannot be reached at start, the source's Fetch
// failed for longer than Config.SourceFailureTimeout or with a Permanent
// error, or handlers were still running Config.ShutdownTimeout after ctx
// was done (ErrShutdownTimeout). When a finite source reports
// ErrSourceDone, Run returns nil once every batch has settled.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("consumer: Run is already running")
	}
	defer c.running.Store(false)
	if err := c.preflight(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started
		}
		return err
	}
	// fetching ends when ctx does, or when a worker stops Run with an error
	// or finds the source done.
	fetching, stopFetching := context.WithCancel(ctx)
	defer stopFetching()
	// Work outlives fetching by at most ShutdownTimeout, so that a batch in
	// flight at shutdown still commits and is acknowledged.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stopTimer := context.AfterFunc(fetching, func() {
		t := time.NewTimer(c.cfg.ShutdownTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			cancelWork()
		case <-work.Done():
		}
	})
	defer stopTimer()

	c.log.Info("consumer starting", "strategy", c.cfg.Strategy.Name(), "batch_size", c.cfg.BatchSize, "concurrency", c.cfg.Concurrency)
	if c.pipeline != nil {
		c.pipeline.Pipeline() // this consumer calls AwaitPrevious and Recall
	}
	var background sync.WaitGroup
	c.startBackground(fetching, &background)
	var (
		workers  sync.WaitGroup
		inFlight atomic.Int32
		errOnce  sync.Once
		runErr   error
	)
	for i := 0; i < c.cfg.Concurrency; i++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			if err := c.worker(fetching, work, &inFlight); err != nil {
				errOnce.Do(func() { runErr = err })
				stopFetching()
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		workers.Wait()
		stopFetching()
		background.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-work.Done():
		// ShutdownTimeout passed: contexts are cancelled, and a handler
		// that heeds its context returns at once. One that does not is
		// left behind; its batch can no longer commit.
		select {
		case <-done:
		case <-time.After(shutdownGrace):
			n := inFlight.Load()
			c.log.Error("shutdown timeout: handlers still running; their batches are abandoned and will be delivered again",
				"timeout", c.cfg.ShutdownTimeout, "batches", n)
			c.log.Info("consumer stopped")
			return fmt.Errorf("%w (%s): %d batches abandoned in flight; a handler must return when its context is done", ErrShutdownTimeout, c.cfg.ShutdownTimeout, n)
		}
	}
	c.log.Info("consumer stopped")
	return runErr
}

// shutdownGrace is how long Run waits, once ShutdownTimeout has cancelled
// the batches' contexts, for their handlers to return and their batches to
// roll back and settle.
const shutdownGrace = time.Second

func (c *Consumer) preflight(ctx context.Context) error {
	// Behind a transaction pooler, pgx's named prepared statements break
	// on the first batch; say so now, with the setting to change.
	if p, err := pg.CheckPooling(ctx, c.db); err == nil {
		if err := p.Err(); err != nil {
			return fmt.Errorf("consumer: %w", err)
		}
		if w := p.Warning(); w != "" {
			c.log.Warn("consumer: " + w)
		}
	}
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("consumer: connect: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, c.parkedTable).Scan(&exists); err != nil {
		return fmt.Errorf("consumer: checking tables: %w", err)
	}
	if !exists {
		return fmt.Errorf("consumer: table %s does not exist: call Migrate first", c.parkedTable)
	}
	if err := c.checkSettings(ctx, tx); err != nil {
		return err
	}
	c.checkPool(ctx)
	if c.standbys != nil {
		if err := c.standbys.Check(ctx, c.log); err != nil {
			return err
		}
	}
	if c.maintainer != nil {
		if err := c.maintainer.Maintain(ctx, c.db); err != nil {
			return fmt.Errorf("consumer: %s maintenance: %w", c.cfg.Strategy.Name(), err)
		}
	}
	c.horizonChecked = c.checkHorizon(ctx)
	if r := c.retainer; r != nil {
		if cs := c.contentIDs; cs != nil && cs.ContentIDWindow() > 0 && r.Retention() > cs.ContentIDWindow() {
			c.log.Warn("the source's default dedupe IDs are hashes of the payload, which its broker forgets after its window: a deliberate resend of the same payload after the window is dropped as a duplicate for the whole dedupe retention (give each message its own ID, or a KeyFunc that tells resends apart)",
				"window", cs.ContentIDWindow(), "retention", r.Retention())
		}
	}
	return nil
}

// checkHorizon warns when the strategy's markers can expire before the
// source delivers a message again. It reports false when the source could
// not say, to be asked again.
func (c *Consumer) checkHorizon(ctx context.Context) bool {
	r, h := c.retainer, c.horizon
	if r == nil || h == nil || r.Retention() <= 0 {
		return true
	}
	d, err := h.RedeliveryHorizon(ctx)
	if err != nil {
		c.log.WarnContext(ctx, "cannot read the source's redelivery horizon to compare it with the dedupe retention; asking again later", "err", err)
		return false
	}
	if d > r.Retention() {
		c.log.WarnContext(ctx, "dedupe retention is shorter than the source's redelivery horizon: a message redelivered after its marker expired would be applied again",
			"retention", r.Retention(), "redelivery_horizon", d)
	}
	return true
}

// horizonRetry is the first pause before the redelivery horizon is asked
// again; it doubles up to horizonRetryMax.
var (
	horizonRetry    = 5 * time.Second
	horizonRetryMax = 5 * time.Minute
)

// startBackground runs the strategy's maintenance and warm-up, if it has
// any, and asks again for a redelivery horizon the source could not give
// at start-up, until ctx is done.
func (c *Consumer) startBackground(ctx context.Context, wg *sync.WaitGroup) {
	if !c.horizonChecked {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := horizonRetry; ctx.Err() == nil; d = min(2*d, horizonRetryMax) {
				sleep(ctx, d)
				if ctx.Err() == nil && c.checkHorizon(ctx) {
					return
				}
			}
		}()
	}
	if m := c.maintainer; m != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.RunMaintenance(ctx, c.db); err != nil && ctx.Err() == nil {
				c.log.Error("strategy maintenance stopped", "strategy", c.cfg.Strategy.Name(), "err", err)
			}
		}()
	}
	if w := c.warmer; w != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Warm(ctx, c.db); err != nil && ctx.Err() == nil {
				c.log.Error("strategy warm-up failed; it keeps answering by probing the store", "strategy", c.cfg.Strategy.Name(), "err", err)
			}
		}()
	}
}

// errEmptyFetch is a Fetch that broke the Source contract.
var errEmptyFetch = errors.New("source returned no batch and no error; Fetch must block until it has messages")

// worker fetches and processes batches until ctx is done or the source is
// done, and returns nil then. It returns an error when the source failed
// for good (a Permanent error, or failures for longer than
// SourceFailureTimeout). work carries on past ctx for the batch in flight.
func (c *Consumer) worker(ctx, work context.Context, inFlight *atomic.Int32) error {
	failures, batchFailures := 0, 0 // consecutive failures of Fetch, and of batches
	var failingSince time.Time
	for ctx.Err() == nil {
		b, err := c.src.Fetch(ctx, c.cfg.BatchSize)
		if err == nil && (b == nil || len(b.Messages) == 0) {
			err = errEmptyFetch
		}
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return nil
			case errors.Is(err, ErrSourceDone):
				return nil
			case IsPermanent(err):
				c.log.Error("fetch failed permanently; stopping", "err", err)
				return fmt.Errorf("consumer: fetch: %w", err)
			}
			if failures == 0 {
				failingSince = time.Now()
			}
			failures++
			if c.cfg.SourceFailureTimeout > 0 && time.Since(failingSince) >= c.cfg.SourceFailureTimeout {
				c.log.Error("fetch keeps failing; stopping", "for", time.Since(failingSince).Round(time.Millisecond), "failures", failures, "err", err)
				return fmt.Errorf("consumer: fetch failed for %s (%d times): %w", time.Since(failingSince).Round(time.Millisecond), failures, err)
			}
			c.log.Error("fetch failed; retrying", "failures", failures, "err", err)
			sleep(ctx, c.errorBackoff(failures))
			continue
		}
		failures = 0
		inFlight.Add(1)
		err = c.process(work, b)
		inFlight.Add(-1)
		if err != nil {
			batchFailures++
			sleep(ctx, c.errorBackoff(batchFailures))
		} else {
			batchFailures = 0
		}
	}
	return nil
}

// errorBackoff is the pause after consecutive infrastructure failures.
func (c *Consumer) errorBackoff(failures int) time.Duration {
	return backoff(c.cfg.RetryBackoff/4, 30*time.Second, failures)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
