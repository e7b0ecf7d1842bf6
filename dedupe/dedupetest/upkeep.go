package dedupetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
)

// prompt is how long a background call of the strategy may take to return
// once its context is cancelled before the suite calls it stuck.
const prompt = 10 * time.Second

// running is a call of the strategy running in the background.
type running struct {
	e      *env
	what   string
	cancel context.CancelFunc
	done   chan error
	ended  bool
	err    error
}

// start runs f in the background with a context that stop (or the end of
// the test, before the harness closes the pool) cancels.
func (e *env) start(what string, f func(ctx context.Context) error) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{e: e, what: what, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- f(ctx) }()
	e.Cleanup(func() {
		if !r.ended {
			cancel()
			select {
			case <-r.done:
			case <-time.After(prompt):
			}
		}
	})
	return r
}

// returned reports whether the call has returned, without waiting, and
// its error if so.
func (r *running) returned() (bool, error) {
	if r.ended {
		return true, r.err
	}
	select {
	case r.err = <-r.done:
		r.ended = true
		return true, r.err
	default:
		return false, nil
	}
}

// stop cancels the call's context and waits (at most prompt) until it
// returns, failing the test if it does not. It returns the call's error.
func (r *running) stop() error {
	r.e.Helper()
	if ended, err := r.returned(); ended {
		return err
	}
	r.cancel()
	select {
	case r.err = <-r.done:
		r.ended = true
		return r.err
	case <-time.After(prompt):
		r.ended = true // abandoned: the cleanup does not wait again
		r.e.Fatalf("%s did not return within %v of its context being cancelled", r.what, prompt)
		return nil
	}
}

// wait waits (at most d) until the call returns by itself.
func (r *running) wait(d time.Duration) (bool, error) {
	if ended, err := r.returned(); ended {
		return true, err
	}
	select {
	case r.err = <-r.done:
		r.ended = true
		return true, r.err
	case <-time.After(d):
		return false, nil
	}
}

// cancelled is true for nil or an error of a cancelled context.
func cancelled(err error) bool {
	return err == nil || errors.Is(err, context.Canceled)
}

// testMigrator: on the harness's migrated store, Migrate applies nothing
// more; on an empty database, PendingMigrations lists the lines'
// migrations, Migrate applies them all, a second Migrate applies nothing,
// and the strategy then claims (after Maintain, when it is a Maintainer,
// as the consumer does); and the script of MigrationSQL, run by hand on
// another empty database, does the same.
func testMigrator(e *env) {
	m := capability[dedupe.Migrator](e, "Migrator")
	ctx := context.Background()
	lines := m.Migrations()
	if len(lines) == 0 {
		e.Fatal("Migrations() returns no line")
	}
	schema := e.migrationsSchema(lines)
	total := 0
	names := map[string]bool{}
	for _, l := range lines {
		ms, err := l.Render(schema)
		if err != nil || len(ms) == 0 || l.Name == "" || names[l.Name] {
			e.Errorf("Migrations(): line %q renders %d migrations, %v (want a unique name and at least one migration)", l.Name, len(ms), err)
		}
		names[l.Name] = true
		total += len(ms)
	}

	if applied, err := pg.Migrate(ctx, e.pool, schema, m.Migrations()...); err != nil || len(applied) != 0 {
		e.Errorf("Migrate on the harness's migrated store applied %d migrations, %v; want none", len(applied), err)
	}

	db := e.emptyDatabase()
	pending, err := pg.PendingMigrations(ctx, db, schema, lines...)
	if err != nil || len(pending) != total {
		e.Errorf("PendingMigrations on an empty database: %d, %v; want all %d", len(pending), err, total)
	}
	applied, err := pg.Migrate(ctx, db, schema, lines...)
	if err != nil || len(applied) != total {
		e.Fatalf("Migrate on an empty database applied %d migrations, %v; want all %d", len(applied), err, total)
	}
	if again, err := pg.Migrate(ctx, db, schema, m.Migrations()...); err != nil || len(again) != 0 {
		e.Errorf("a second Migrate applied %d migrations, %v; want none", len(again), err)
	}
	if left, err := pg.PendingMigrations(ctx, db, schema, m.Migrations()...); err != nil || len(left) != 0 {
		e.Errorf("PendingMigrations after Migrate: %d, %v; want none", len(left), err)
	}
	e.claimsWork("after Migrate", db)

	script, err := pg.MigrationSQL(schema, lines...)
	if err != nil {
		e.Fatalf("MigrationSQL: %v", err)
	}
	db = e.emptyDatabase()
	if _, err := db.Exec(ctx, script); err != nil {
		e.Fatalf("running the script of MigrationSQL: %v\n%s", err, script)
	}
	if again, err := pg.Migrate(ctx, db, schema, m.Migrations()...); err != nil || len(again) != 0 {
		e.Errorf("Migrate after the script of MigrationSQL applied %d migrations, %v; want none", len(again), err)
	}
	e.claimsWork("after the script of MigrationSQL", db)
}

// migrationsSchema returns the schema of the migrations table in which the
// harness recorded lines, or pg.DefaultSchema.
func (e *env) migrationsSchema(lines []pg.Line) string {
	e.Helper()
	ctx := context.Background()
	var schemas []string
	rows, err := e.pool.Query(ctx, `SELECT table_schema FROM information_schema.tables WHERE table_name = 'schema_migrations' ORDER BY 1`)
	if err == nil {
		schemas, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		e.Fatalf("looking for the migrations table: %v", err)
	}
	names := make([]string, len(lines))
	for i, l := range lines {
		names[i] = l.Name
	}
	for _, s := range schemas {
		var n int
		table := pgx.Identifier{s, "schema_migrations"}.Sanitize()
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE line = ANY($1)`, names).Scan(&n); err == nil && n > 0 {
			return s
		}
	}
	return pg.DefaultSchema
}

// emptyDatabase creates an empty database on the harness's server, for as
// long as the test runs.
func (e *env) emptyDatabase() *pgxpool.Pool {
	e.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("dedupetest_%d_%08x", time.Now().UnixNano(), rand.Uint32())
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := e.pool.Exec(ctx, `CREATE DATABASE `+ident); err != nil {
		e.Fatalf("creating an empty database (the Migrator checks need one; the harness's role needs CREATEDB): %v", err)
	}
	cfg := e.pool.Config().Copy()
	cfg.ConnConfig.Database = name
	cfg.MaxConns = 4
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		e.Fatalf("connecting to the empty database: %v", err)
	}
	e.Cleanup(func() {
		db.Close()
		_, _ = e.pool.Exec(context.Background(), `DROP DATABASE IF EXISTS `+ident+` WITH (FORCE)`)
	})
	return db
}

// claimsWork runs Maintain on db when the strategy is a Maintainer, then
// claims keys of a scope of its own twice on db: new, then duplicates.
func (e *env) claimsWork(when string, db *pgxpool.Pool) {
	e.Helper()
	ctx := context.Background()
	if mt, ok := e.s.(dedupe.Maintainer); ok {
		if err := mt.Maintain(ctx, db); err != nil {
			e.Fatalf("%s: Maintain: %v", when, err)
		}
	}
	scope := fmt.Sprintf("migrated-%08x", rand.Uint32())
	ks := e.keys(scope, 0, 3)
	for _, want := range []dedupe.Verdict{newV, dup} {
		tx, err := db.Begin(ctx)
		if err != nil {
			e.Fatalf("%s: begin: %v", when, err)
		}
		vs, err := e.claimTx(ctx, tx, ks)
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			_ = tx.Rollback(ctx)
			e.Fatalf("%s: Claim(%s): %v", when, describe(ks), err)
		}
		e.committed(ks, vs)
		e.expect(when, ks, vs, all(want, len(ks))...)
	}
}

// testMaintainer: Maintain succeeds twice in a row and keeps the markers;
// claims are right while RunMaintenance runs; RunMaintenance does not fail
// on its own on a healthy database, and returns promptly, nil or with the
// context's error, once its context is cancelled.
func testMaintainer(e *env) {
	mt := capability[dedupe.Maintainer](e, "Maintainer")
	ctx := context.Background()
	ks := e.keys("maint", 0, 5)
	e.expect("first claim", ks, e.claim(ks), all(newV, 5)...)
	for i := 1; i <= 2; i++ {
		if err := mt.Maintain(ctx, e.pool); err != nil {
			e.Fatalf("Maintain (call %d in a row): %v", i, err)
		}
	}
	ks = e.keys("maint", 0, 8)
	e.expect("after Maintain twice", ks, e.claim(ks), append(all(dup, 5), all(newV, 3)...)...)

	r := e.start("RunMaintenance", func(ctx context.Context) error { return mt.RunMaintenance(ctx, e.pool) })
	ks = e.keys("maint", 0, 12)
	e.expect("while RunMaintenance runs", ks, e.claim(ks), append(all(dup, 8), all(newV, 4)...)...)
	if ended, err := r.returned(); ended && err != nil {
		e.Errorf("RunMaintenance failed before its context was cancelled: %v", err)
	} else if err := r.stop(); !ended && !cancelled(err) {
		e.Errorf("RunMaintenance returned %v once its context was cancelled; want nil or the context's error", err)
	}
	ks = e.keys("maint", 0, 14)
	e.expect("after RunMaintenance", ks, e.claim(ks), append(all(dup, 12), all(newV, 2)...)...)
}

// testWarmer: Warm with a cancelled context returns promptly and leaves the
// strategy right; claims made while Warm runs and after it returned give
// the verdicts they would without it, for markers this strategy committed
// and reported, committed without reporting (as another process's), and
// rolled back; and Warm returns, nil or with the context's error, once its
// context is cancelled.
func testWarmer(e *env) {
	w := capability[dedupe.Warmer](e, "Warmer")
	ks := e.keys("warm", 0, 20)
	e.expect("first claim", ks, e.claim(ks), all(newV, 20)...)
	rb := e.keys("warm", 20, 25)
	e.claimRollback(rb)
	other := e.keys("warm-other", 0, 10)
	e.expect("claim, committed and never reported", other, e.claimUnreported(other), all(newV, 10)...)

	r := e.start("Warm with a cancelled context", func(ctx context.Context) error {
		c, cancel := context.WithCancel(ctx)
		cancel()
		return w.Warm(c, e.pool)
	})
	if _, err := r.wait(prompt); !r.ended {
		e.Fatalf("Warm with a cancelled context did not return within %v", prompt)
	} else if !cancelled(err) {
		e.Errorf("Warm with a cancelled context returned %v; want nil or the context's error", err)
	}
	e.checkWarm("after a cancelled Warm", 30)

	r = e.start("Warm", func(ctx context.Context) error { return w.Warm(ctx, e.pool) })
	e.checkWarm("while Warm runs", 40)
	ended, err := r.wait(prompt)
	if ended && err != nil {
		e.Errorf("Warm failed on a healthy database: %v", err)
	}
	if !ended {
		if err := r.stop(); !cancelled(err) {
			e.Errorf("Warm returned %v once its context was cancelled; want nil or the context's error", err)
		}
	}
	e.checkWarm("after Warm", 50)
}

// checkWarm claims keys 0 to n of scope "warm" (those below n-10
// committed before, the last ten new) and the ten unreported keys of
// scope "warm-other".
func (e *env) checkWarm(when string, n int) {
	e.Helper()
	ks := append(e.keys("warm", 0, n), e.keys("warm-other", 0, 10)...)
	e.expect(when, ks, e.claim(ks), append(append(all(dup, n-10), all(newV, 10)...), all(dup, 10)...)...)
}
