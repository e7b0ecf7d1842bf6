package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// serverSettings are the settings a DBA may give the consumer's role or
// database that decide how the consumer reads a failure, as a batch
// transaction sees them at start-up.
type serverSettings struct {
	statementTimeout time.Duration // statement_timeout
	lockTimeout      time.Duration // lock_timeout
	idleTxTimeout    time.Duration // idle_in_transaction_session_timeout
}

// readSettings reads the timeouts in effect in tx.
func readSettings(ctx context.Context, tx pgx.Tx) (serverSettings, error) {
	var s serverSettings
	var st, lt, it int64 // milliseconds, their unit in pg_settings
	err := tx.QueryRow(ctx, `SELECT
		(SELECT setting::bigint FROM pg_settings WHERE name = 'statement_timeout'),
		(SELECT setting::bigint FROM pg_settings WHERE name = 'lock_timeout'),
		(SELECT setting::bigint FROM pg_settings WHERE name = 'idle_in_transaction_session_timeout')`).Scan(&st, &lt, &it)
	if err != nil {
		return s, err
	}
	s.statementTimeout, s.lockTimeout, s.idleTxTimeout = ms(st), ms(lt), ms(it)
	return s, nil
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// checkSettings reads the server's timeouts, decides from them how long a
// batch transaction may stay idle before the server ends its session, and
// warns about the combinations that make the consumer blame the wrong
// party.
func (c *Consumer) checkSettings(ctx context.Context, tx pgx.Tx) error {
	s, err := readSettings(ctx, tx)
	if err != nil {
		return fmt.Errorf("consumer: reading the server's timeouts: %w", err)
	}
	c.server = s
	c.idleTx = c.cfg.IdleTxTimeout
	if c.idleTx <= 0 {
		c.idleTx = s.idleTxTimeout // the server's setting stays in force
	}
	c.log.InfoContext(ctx, "server timeouts", "statement_timeout", s.statementTimeout, "lock_timeout", s.lockTimeout,
		"idle_in_transaction_session_timeout", s.idleTxTimeout, "batch_idle_timeout", c.idleTx)
	if s.statementTimeout > 0 && (s.lockTimeout == 0 || s.lockTimeout >= s.statementTimeout) {
		c.log.WarnContext(ctx, "statement_timeout is set and lock_timeout is not lower: a handler's statement that waits for a lock held elsewhere until statement_timeout fires counts as its message's failure and may park it; set lock_timeout below statement_timeout so that lock waits are retried as transient",
			"statement_timeout", s.statementTimeout, "lock_timeout", s.lockTimeout)
	}
	if c.cfg.IdleTxTimeout > 0 && s.idleTxTimeout > 0 && c.cfg.IdleTxTimeout > s.idleTxTimeout {
		c.log.WarnContext(ctx, "IdleTxTimeout raises the server's idle_in_transaction_session_timeout for the batch transactions (set IdleTxTimeout to a negative value to keep the server's)",
			"idle_tx_timeout", c.cfg.IdleTxTimeout, "idle_in_transaction_session_timeout", s.idleTxTimeout)
	}
	return nil
}

// poolStat is implemented by *pgxpool.Pool.
type poolStat interface {
	Stat() *pgxpool.Stat
}

// checkPool reports a pool that cannot give every lane its connection:
// Concurrency batches at once, each holding one connection for its
// transaction, and one more for each background job of the strategy
// (maintenance, warm-up), which takes it now and then. Fewer connections
// than Concurrency is a warning: lanes wait for a connection all the time.
// Fewer than that plus the background jobs' is logged at info level: a
// batch waits while the strategy's background work runs. Neither is
// refused, since a smaller pool only caps how many batches run at once.
func (c *Consumer) checkPool(ctx context.Context) {
	p, ok := c.db.(poolStat)
	if !ok {
		return
	}
	need, extra := c.connsNeeded()
	have := int(p.Stat().MaxConns())
	if have >= need {
		return
	}
	msg := fmt.Sprintf("pool allows %d connections, Concurrency %d needs at least %d (%d batches at once and %d for the strategy's background work)",
		have, c.cfg.Concurrency, need, c.cfg.Concurrency, extra)
	attrs := []any{"max_conns", have, "concurrency", c.cfg.Concurrency, "needed", need}
	if have < c.cfg.Concurrency {
		c.log.WarnContext(ctx, msg+fmt.Sprintf(": at most %d batches run at once and the other lanes wait for a connection; raise the pool's MaxConns (pool_max_conns) or lower Concurrency", have), attrs...)
		return
	}
	c.log.InfoContext(ctx, msg+": a batch waits for a connection while the background work runs", attrs...)
}

// connsNeeded is how many connections the consumer uses at once at most,
// and how many of them its background jobs take.
func (c *Consumer) connsNeeded() (need, extra int) {
	if c.maintainer != nil {
		extra++
	}
	if c.warmer != nil {
		extra++
	}
	return c.cfg.Concurrency + extra, extra
}
