package idempotency

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// store is the one owner of the responses table's SQL.
type store struct {
	insertSQL string
	selectSQL string
	sweepSQL  string
}

func newStore(schema, table string) store {
	t := pgx.Identifier{schema, table}.Sanitize()
	return store{
		// A plain INSERT: the key's row is read under the key's lock
		// before, so a row there now is a claim that went around the lock,
		// and its unique violation a race that passes (503).
		insertSQL: `INSERT INTO ` + t + ` (scope, key, fingerprint, status, raw_headers, body)
VALUES ($1, $2, $3, $4, $5, $6)`,
		selectSQL: `SELECT status, headers, raw_headers, body, fingerprint FROM ` + t + ` WHERE scope = $1 AND key = $2`,
		sweepSQL: `DELETE FROM ` + t + ` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM ` + t + `
    WHERE created_at < now() - $1::bigint * interval '1 microsecond'
    LIMIT $2
    FOR UPDATE SKIP LOCKED))`,
	}
}

// stored is a response as kept in the table.
type stored struct {
	status      int
	headers     [][]byte // name, value, name, value, …, byte for byte
	body        []byte
	fingerprint []byte
}

// querier is what a pgx.Tx and a pg.DB have in common.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// load returns the stored response of (scope, key), and false when there
// is none.
func (s store) load(ctx context.Context, q querier, scope, key string) (stored, bool, error) {
	var r stored
	var status int32
	var text []string
	err := q.QueryRow(ctx, s.selectSQL, scope, key).Scan(&status, &text, &r.headers, &r.body, &r.fingerprint)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false, nil
	}
	if r.headers == nil { // a row stored before header values were kept as bytes
		for _, v := range text {
			r.headers = append(r.headers, []byte(v))
		}
	}
	r.status = int(status)
	return r, err == nil, err
}

// header returns the stored headers.
func (r stored) header() http.Header {
	h := make(http.Header, len(r.headers)/2+1)
	for i := 0; i+1 < len(r.headers); i += 2 {
		h.Add(string(r.headers[i]), string(r.headers[i+1]))
	}
	return h
}

// keep returns the headers of h to store, in the order of names, and their
// size in bytes.
func keep(h http.Header, names []string) ([][]byte, int) {
	out := [][]byte{}
	size := 0
	for _, n := range names {
		for _, v := range h.Values(n) {
			out = append(out, []byte(n), []byte(v))
			size += len(n) + len(v)
		}
	}
	return out, size
}

// Migrations returns the migration lines of Config.Strategy's markers (when
// there is one and it is a dedupe.Migrator) and of the responses table, for pg.Migrate,
// pg.PendingMigrations and pg.MigrationSQL. The responses line
// creates its table in Config.Schema whichever schema holds the migrations
// table.
func (m *Middleware) Migrations() []pg.Line {
	var lines []pg.Line
	if mg, ok := m.cfg.Strategy.(dedupe.Migrator); ok {
		lines = append(lines, mg.Migrations()...)
	}
	return append(lines, ResponsesLine(m.cfg.Schema, m.cfg.Table))
}

// ResponsesLine returns the migration line of the responses table
// schema.table (DefaultTable in pg.DefaultSchema for a middleware with
// the default Config), for tools that migrate without a Middleware, such
// as the CLI's migrate --idempotency.
func ResponsesLine(schema, table string) pg.Line {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the embedded directory always exists
	}
	return pg.Line{
		Name: "idempotency:" + schema + "." + table,
		FS:   sub,
		Idents: map[string]string{
			"schema":         schema,
			"table":          table,
			"created_at_idx": table + "_created_at_idx",
		},
	}
}

// Migrate applies Migrations with pg.Migrate, keeping the migrations
// table in Config.Schema, as Consumer.Migrate does for a consumer.
func (m *Middleware) Migrate(ctx context.Context) error {
	_, err := pg.Migrate(ctx, m.db, m.cfg.Schema, m.Migrations()...)
	return err
}

// Sweep deletes the stored responses older than Config.Retention, in
// statements of at most Config.SweepBatch rows, each committed on its own,
// and returns how many it deleted. The strategy's markers are swept by the
// strategy (Run runs its maintenance).
func (m *Middleware) Sweep(ctx context.Context) (deleted int64, err error) {
	batch := int64(m.cfg.SweepBatch)
	for {
		if err := ctx.Err(); err != nil {
			return deleted, fmt.Errorf("idempotency: sweep: %w", err)
		}
		tag, err := m.db.Exec(ctx, m.store.sweepSQL, m.cfg.Retention.Microseconds(), batch)
		if err != nil {
			return deleted, fmt.Errorf("idempotency: sweep: %w", err)
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < batch {
			return deleted, nil
		}
	}
}

// Maintain runs the strategy's Maintain, when it is a dedupe.Maintainer
// (bloom creates its partitions; idset needs nothing). A strategy that
// needs it fails every claim (503) until it ran: call Maintain before
// serving, or let Run call it.
func (m *Middleware) Maintain(ctx context.Context) error {
	if mt, ok := m.cfg.Strategy.(dedupe.Maintainer); ok {
		if err := mt.Maintain(ctx, m.db); err != nil {
			return fmt.Errorf("idempotency: %s maintenance: %w", m.cfg.Strategy.Name(), err)
		}
	}
	return nil
}

// Run does what a consumer does for its strategy, and sweeps the responses:
// it calls Maintain and returns its error, then runs until ctx is done the
// strategy's RunMaintenance (idset's retention sweeper, bloom's partition
// upkeep), its Warm (a dedupe.Warmer's), and Sweep every
// Config.SweepInterval. It returns nil when ctx is done. Without Run
// nothing expires.
func (m *Middleware) Run(ctx context.Context) error {
	s := m.cfg.Strategy
	if err := m.Maintain(ctx); err != nil {
		return err
	}
	mt, _ := s.(dedupe.Maintainer)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { m.sweepLoop(ctx) })
	if w, ok := s.(dedupe.Warmer); ok {
		wg.Go(func() {
			if err := w.Warm(ctx, m.db); err != nil && ctx.Err() == nil {
				m.log.Error("strategy warm-up failed; it keeps answering by probing the store", "strategy", s.Name(), "err", err)
			}
		})
	}
	if mt != nil {
		if err := mt.RunMaintenance(ctx, m.db); err != nil && ctx.Err() == nil {
			m.log.Error("strategy maintenance stopped", "strategy", s.Name(), "err", err)
		}
	}
	return nil
}

func (m *Middleware) sweepLoop(ctx context.Context) {
	t := time.NewTicker(m.cfg.SweepInterval)
	defer t.Stop()
	for {
		n, err := m.Sweep(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			m.log.Warn("idempotency: sweep failed", "table", m.cfg.Schema+"."+m.cfg.Table, "deleted", n, "err", err)
		} else if n > 0 {
			m.log.Info("idempotency: swept expired responses", "table", m.cfg.Schema+"."+m.cfg.Table, "deleted", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
