package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/consumertest"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// bouncerEnv is newEnv on a database reached through PgBouncer in
// transaction pooling mode, with the pool's statements run in mode.
func bouncerEnv(t *testing.T, mode pgx.QueryExecMode, bcfg consumertest.Config) *env {
	t.Helper()
	pool := pgtest.NewBouncerPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.DefaultQueryExecMode = mode
		c.MaxConns = 8
	})
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (
		msg_id  text NOT NULL,
		lane    text NOT NULL,
		payload bytea NOT NULL
	)`); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, pool: pool, broker: consumertest.New(bcfg), hooks: &consumertest.Counter{}}
}

var bouncerStrategies = map[string]func() (dedupe.Strategy, error){
	"idset": func() (dedupe.Strategy, error) { return idset.New(idset.Config{}) },
	"highwater": func() (dedupe.Strategy, error) {
		return highwater.New(highwater.Config{Mode: highwater.Monotonic})
	},
	"bloom": func() (dedupe.Strategy, error) {
		return bloom.New(bloom.Config{Slice: time.Minute, Retention: time.Hour})
	},
}

// Through PgBouncer in transaction pooling, with the pgx settings the
// documentation names, every strategy keeps the promise: N messages
// delivered with duplicates and lost acks leave exactly N effects.
func TestConsumerThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeSimpleProtocol} {
		for name, mk := range bouncerStrategies {
			t.Run(name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				s, err := mk()
				if err != nil {
					t.Fatal(err)
				}
				e := bouncerEnv(t, mode, consumertest.Config{Lanes: 3, DuplicateRate: 0.3, LostAckRate: 0.05})
				const senders, per = 3, 60
				for sender := range senders {
					for seq := 1; seq <= per; seq++ {
						e.broker.Publish(sender, seqMsg(fmt.Sprintf("s%d", sender), seq))
					}
				}
				cfg := consumer.Config{Strategy: s, BatchSize: 20, Concurrency: 3}
				if name == "highwater" {
					cfg.KeyFunc = seqKey
				}
				e.runUntilIdle(e.consumer(cfg), time.Minute)
				e.checkOnceEach(senders * per)
				if p := e.parked(); len(p) != 0 {
					t.Errorf("%d messages parked, want none: %+v", len(p), p[0])
				}
			})
		}
	}
}

// A consumer whose pool keeps named prepared statements (pgx's default
// mode) is refused at start-up behind a transaction pooler, by Migrate,
// with the setting to change; nothing is claimed or applied.
func TestConsumerRefusesCachedStatementsThroughPgBouncer(t *testing.T) {
	t.Parallel()
	e := bouncerEnv(t, pgx.QueryExecModeCacheStatement, consumertest.Config{Lanes: 1})
	c, err := consumer.New(e.pool, e.broker, e.config(consumer.Config{}))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Migrate(context.Background())
	if !errors.Is(err, pg.ErrTransactionPooling) || !strings.Contains(err.Error(), "QueryExecModeExec") {
		t.Fatalf("Migrate: %v; want ErrTransactionPooling naming pgx.QueryExecModeExec", err)
	}
}

// Redrive through PgBouncer in transaction pooling: two redrives of the
// same parked rows at once apply each message once, and the originals
// delivered again are duplicates.
func TestRedriveThroughPgBouncer(t *testing.T) {
	t.Parallel()
	e := bouncerEnv(t, pgx.QueryExecModeExec, consumertest.Config{Lanes: 2, DuplicateRate: 0.2})
	const bad, good = 8, 12
	for i, id := range ids("bad", bad) {
		e.broker.Publish(i%2, msg(id, "bad "+id))
	}
	for i, id := range ids("ok", good) {
		e.broker.Publish(i%2, msg(id, "ok"))
	}
	f := &fixable{}
	e.runUntilIdle(e.consumer(consumer.Config{Handler: f.handle}), 30*time.Second)
	if n := e.parkedCount(); n != bad {
		t.Fatalf("parked %d, want %d", n, bad)
	}
	f.fixed.Store(true)
	var wg sync.WaitGroup
	results := make([]parked.RedriveResult, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { results[i], errs[i] = e.redriveConfig(f.handle).run(e) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("redrive %d: %v", i, err)
		}
	}
	if applied := results[0].Applied + results[1].Applied; applied != bad || results[0].Failed+results[1].Failed != 0 {
		t.Fatalf("results %+v / %+v: want %d applied in all, none failed", results[0], results[1], bad)
	}
	if n := e.parkedCount(); n != 0 {
		t.Fatalf("%d rows still parked", n)
	}
	for _, id := range ids("bad", bad) {
		e.broker.Publish(0, msg(id, "bad "+id))
	}
	e.runUntilIdle(e.consumer(consumer.Config{Handler: f.handle}), 30*time.Second)
	counts := e.effectCounts()
	if len(counts) != bad+good {
		t.Errorf("%d messages applied, want %d", len(counts), bad+good)
	}
	for id, n := range counts {
		if n != 1 {
			t.Errorf("%s applied %d times", id, n)
		}
	}
}

// Run refuses the same pool at start-up, before any batch, when the tables
// were migrated through another pool: no message is claimed or applied.
func TestConsumerRunRefusesCachedStatementsThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := bouncerEnv(t, pgx.QueryExecModeCacheStatement, consumertest.Config{Lanes: 1})
	cfg := e.config(consumer.Config{})
	exec, err := pgxpool.NewWithConfig(ctx, func() *pgxpool.Config {
		c := e.pool.Config()
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		return c
	}())
	if err != nil {
		t.Fatal(err)
	}
	defer exec.Close()
	migrator, err := consumer.New(exec, e.broker, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrator.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	e.broker.Publish(0, consumer.Message{ID: "m1", Value: []byte("m1")})
	c, err := consumer.New(e.pool, e.broker, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithTimeout(ctx, 2*time.Minute) // bounds a hang, no more
	defer cancel()
	err = c.Run(runCtx)
	if !errors.Is(err, pg.ErrTransactionPooling) || !strings.Contains(err.Error(), "QueryExecModeExec") {
		t.Fatalf("Run: %v; want ErrTransactionPooling naming pgx.QueryExecModeExec", err)
	}
	var effects int
	if err := exec.QueryRow(ctx, `SELECT count(*) FROM effects`).Scan(&effects); err != nil || effects != 0 {
		t.Fatalf("%d effects (%v), want none", effects, err)
	}
}
