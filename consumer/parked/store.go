package parked

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
)

// Store is the parked table's one owner: every statement on the
// table is one of its methods. Methods without a pgx.Tx run in a
// transaction of their own on the store's database; the ...Tx methods run
// in the caller's transaction, so that what they do commits or rolls back
// with it.
type Store struct {
	db     pg.DB
	schema string
	table  string
	ident  string // quoted schema.table
}

// NewStore returns the store of the parked table schema.table on db.
// schema defaults to "effectively" and table to "parked", as in
// consumer.Config. db may be nil when only the ...Tx methods are used.
func NewStore(db pg.DB, schema, table string) *Store {
	if schema == "" {
		schema = pg.DefaultSchema
	}
	if table == "" {
		table = "parked"
	}
	return &Store{db: db, schema: schema, table: table, ident: pgx.Identifier{schema, table}.Sanitize()}
}

// Table returns the table's quoted name, schema.table.
func (s *Store) Table() string { return s.ident }

// Line returns the table's migration line (see Line).
func (s *Store) Line() pg.Line { return Line(s.schema, s.table) }

// Filter selects rows of the parked table. The zero value selects
// every row.
type Filter struct {
	// Scope, when set, limits the selection to this scope.
	Scope string
	// Source, when set, limits it to messages of this source ("kafka",
	// "sqs", …), byte for byte.
	Source string
	// Reason, when set, limits it to rows parked for this reason.
	Reason string
	// IDs, when not empty, limits it to these row ids.
	IDs []int64
	// Refs, when not empty, limits it to rows whose ref is one of these,
	// byte for byte. Several rows may share a ref.
	Refs []string
	// OlderThan, when positive, limits it to rows first parked longer ago.
	OlderThan time.Duration
	// Limit is the most rows selected, oldest first. Defaults to 0: no
	// limit.
	Limit int
}

// where returns f as a WHERE clause on $1…$6 and its arguments, with the
// limit as a seventh.
func (f Filter) where() (string, []any) {
	var ids []int64
	if len(f.IDs) > 0 {
		ids = f.IDs
	}
	var refs [][]byte
	for _, r := range f.Refs {
		refs = append(refs, []byte(r))
	}
	var source []byte
	if f.Source != "" {
		source = []byte(f.Source)
	}
	var limit *int64
	if f.Limit > 0 {
		l := int64(f.Limit)
		limit = &l
	}
	return `($1 = '' OR scope = $1) AND ($2 = '' OR reason = $2) AND ($3::bigint[] IS NULL OR id = ANY($3))
    AND ($4::bigint = 0 OR parked_at < now() - $4::bigint * interval '1 microsecond')
    AND ($5::bytea[] IS NULL OR ref_bytes = ANY($5))
    AND ($6::bytea IS NULL OR coalesce(source_bytes, convert_to(source, 'UTF8')) = $6)`,
		[]any{f.Scope, f.Reason, ids, max(f.OlderThan.Microseconds(), 0), refs, source, limit}
}

// selectIDs is the filter's rows, oldest first, limited.
func (f Filter) selectIDs(table string) (string, []any) {
	where, args := f.where()
	return `SELECT id FROM ` + table + ` WHERE ` + where + ` ORDER BY id LIMIT $7`, args
}

const parkedColumns = `id, consumer, scope, dedupe_id, sender, seq, fingerprint, has_marker,
    source, source_bytes, lane, lane_bytes, ref_bytes, msg_key, payload, headers, message_time,
    attempts, reason, last_error, park_count, parked_at, last_parked_at`

// scanParked reads a row of parkedColumns.
func scanParked(r pgx.CollectableRow) (Row, error) {
	var (
		p                        Row
		srcBytes, laneBytes, ref []byte
		headers                  []byte
		mt                       *time.Time
		attempts, count          int32
	)
	if err := r.Scan(&p.ID, &p.Consumer, &p.Scope, &p.DedupeID, &p.Sender, &p.Seq, &p.Fingerprint, &p.HasMarker,
		&p.Source, &srcBytes, &p.Lane, &laneBytes, &ref, &p.MsgKey, &p.Payload, &headers, &mt,
		&attempts, &p.Reason, &p.LastError, &count, &p.ParkedAt, &p.LastParkedAt); err != nil {
		return p, err
	}
	// The text columns hold a readable rendering; the exact bytes are
	// beside them when it differs.
	if srcBytes != nil {
		p.Source = string(srcBytes)
	}
	if laneBytes != nil {
		p.Lane = string(laneBytes)
	}
	p.Ref = string(ref)
	if mt != nil {
		p.MessageTime = *mt
	}
	p.Attempts, p.ParkCount = int(attempts), int(count)
	hs, err := headersFromJSON(headers)
	if err != nil {
		return p, fmt.Errorf("parked row %d: %w", p.ID, err)
	}
	p.Headers = hs
	return p, nil
}

// run runs fn in a transaction of its own on the store's database and
// commits it.
func (s *Store) run(ctx context.Context, fn func(tx pgx.Tx) error) error {
	if s.db == nil {
		return fmt.Errorf("consumer: parked table %s: the store has no database", s.ident)
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("consumer: parked table %s: %w", s.ident, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("consumer: parked table %s: commit: %w", s.ident, err)
	}
	return nil
}

func (s *Store) wrap(what string, err error) error {
	return fmt.Errorf("consumer: parked table %s: %s: %w", s.ident, what, err)
}

// Exists reports whether the table exists.
func (s *Store) Exists(ctx context.Context) (bool, error) {
	var ok bool
	err := s.run(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.ident).Scan(&ok)
	})
	return ok, err
}

// List returns the rows f selects, oldest first.
func (s *Store) List(ctx context.Context, f Filter) ([]Row, error) {
	var out []Row
	err := s.run(ctx, func(tx pgx.Tx) (err error) {
		out, err = s.ListTx(ctx, tx, f)
		return err
	})
	return out, err
}

// ListTx is List in tx.
func (s *Store) ListTx(ctx context.Context, tx pgx.Tx, f Filter) ([]Row, error) {
	where, args := f.where()
	rows, err := tx.Query(ctx, `SELECT `+parkedColumns+` FROM `+s.ident+` WHERE `+where+` ORDER BY id LIMIT $7`, args...)
	if err != nil {
		return nil, s.wrap("list", err)
	}
	out, err := pgx.CollectRows(rows, scanParked)
	if err != nil {
		return nil, s.wrap("list", err)
	}
	return out, nil
}

// Get returns the row id, and an error wrapping pgx.ErrNoRows when there
// is none.
func (s *Store) Get(ctx context.Context, id int64) (Row, error) {
	ps, err := s.List(ctx, Filter{IDs: []int64{id}})
	if err != nil {
		return Row{}, err
	}
	if len(ps) == 0 {
		return Row{}, s.wrap(fmt.Sprintf("row %d", id), pgx.ErrNoRows)
	}
	return ps[0], nil
}

// IDs returns the ids of the rows f selects, oldest first.
func (s *Store) IDs(ctx context.Context, f Filter) ([]int64, error) {
	var out []int64
	err := s.run(ctx, func(tx pgx.Tx) error {
		sql, args := f.selectIDs(s.ident)
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return s.wrap("select", err)
		}
		if out, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return s.wrap("select", err)
		}
		return nil
	})
	return out, err
}

// Count returns how many rows f selects (at most f.Limit).
func (s *Store) Count(ctx context.Context, f Filter) (int64, error) {
	var n int64
	err := s.run(ctx, func(tx pgx.Tx) error {
		sql, args := f.selectIDs(s.ident)
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM (`+sql+`) s`, args...).Scan(&n); err != nil {
			return s.wrap("count", err)
		}
		return nil
	})
	return n, err
}

// Count is how many rows of a scope were parked for a reason, and
// when the oldest of them was.
type Count struct {
	Scope, Reason string
	Rows          int64
	Oldest        time.Time
}

// CountByReason counts the rows of scope ("" for every scope) by scope and
// reason, ordered by scope and reason.
func (s *Store) CountByReason(ctx context.Context, scope string) ([]Count, error) {
	var out []Count
	err := s.run(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT scope, reason, count(*), min(parked_at) FROM `+s.ident+`
WHERE $1 = '' OR scope = $1 GROUP BY scope, reason ORDER BY scope, reason`, scope)
		if err != nil {
			return s.wrap("count", err)
		}
		if out, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Count]); err != nil {
			return s.wrap("count", err)
		}
		return nil
	})
	return out, err
}

// Delete deletes the rows f selects, for good, and returns how many it
// deleted. A message parked with a marker stays a duplicate if its source
// delivers it again; one parked without would be processed again.
func (s *Store) Delete(ctx context.Context, f Filter) (int64, error) {
	var n int64
	err := s.run(ctx, func(tx pgx.Tx) error {
		sql, args := f.selectIDs(s.ident)
		tag, err := tx.Exec(ctx, `DELETE FROM `+s.ident+` WHERE id IN (`+sql+`)`, args...)
		if err != nil {
			return s.wrap("delete", err)
		}
		n = tag.RowsAffected()
		return nil
	})
	return n, err
}

// HasRefsTx returns, of refs, those that have a row of scope and source, in
// tx.
func (s *Store) HasRefsTx(ctx context.Context, tx pgx.Tx, scope, source string, refs []string) (map[string]bool, error) {
	raw := make([][]byte, len(refs))
	for i, r := range refs {
		raw[i] = []byte(r)
	}
	rows, err := tx.Query(ctx, `SELECT ref_bytes FROM `+s.ident+`
WHERE scope = $1 AND coalesce(source_bytes, convert_to(source, 'UTF8')) = $2 AND ref_bytes = ANY($3::bytea[])`,
		scope, []byte(source), raw)
	if err != nil {
		return nil, s.wrap("refs", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return nil, s.wrap("refs", err)
	}
	out := make(map[string]bool, len(found))
	for _, r := range found {
		out[string(r)] = true
	}
	return out, nil
}

// TakeTx deletes the row id of scope in tx and returns it: the row is
// locked until tx ends, so a concurrent TakeTx of the same row waits and
// then finds it gone. A redrive takes the row in the transaction that
// applies its message, so that both commit or roll back together. When the
// row does not exist (any more), the error wraps pgx.ErrNoRows.
func (s *Store) TakeTx(ctx context.Context, tx pgx.Tx, scope string, id int64) (Row, error) {
	rows, err := tx.Query(ctx, `DELETE FROM `+s.ident+` WHERE id = $1 AND scope = $2 RETURNING `+parkedColumns, id, scope)
	if err != nil {
		return Row{}, s.wrap(fmt.Sprintf("taking row %d", id), err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanParked)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, fmt.Errorf("consumer: parked table %s: row %d of scope %q: %w", s.ident, id, scope, pgx.ErrNoRows)
	}
	if err != nil {
		return p, s.wrap(fmt.Sprintf("taking row %d", id), err)
	}
	return p, nil
}

// RecordFailure notes on the row id that a redrive failed with msg: one
// more attempt, and msg as its last error. The row stays parked.
func (s *Store) RecordFailure(ctx context.Context, id int64, msg string) error {
	return s.run(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE `+s.ident+` SET attempts = attempts + 1, last_error = $2 WHERE id = $1`,
			id, cleanText(msg)); err != nil {
			return s.wrap(fmt.Sprintf("recording the failure of row %d", id), err)
		}
		return nil
	})
}

// LockTx locks the row id of scope in tx without deleting it, and returns
// it: a concurrent TakeTx or LockTx of the row waits until tx ends. With
// skipLocked, a row another transaction holds is not waited for: the error
// then wraps pgx.ErrNoRows, as for a row that does not exist.
func (s *Store) LockTx(ctx context.Context, tx pgx.Tx, scope string, id int64, skipLocked bool) (Row, error) {
	lock := ` FOR UPDATE`
	if skipLocked {
		lock += ` SKIP LOCKED`
	}
	rows, err := tx.Query(ctx, `SELECT `+parkedColumns+` FROM `+s.ident+` WHERE id = $1 AND scope = $2`+lock, id, scope)
	if err != nil {
		return Row{}, s.wrap(fmt.Sprintf("locking row %d", id), err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanParked)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, fmt.Errorf("consumer: parked table %s: row %d of scope %q: %w", s.ident, id, scope, pgx.ErrNoRows)
	}
	if err != nil {
		return p, s.wrap(fmt.Sprintf("locking row %d", id), err)
	}
	return p, nil
}

// DeleteTx deletes the rows ids in tx and returns how many it deleted.
func (s *Store) DeleteTx(ctx context.Context, tx pgx.Tx, ids ...int64) (int64, error) {
	tag, err := tx.Exec(ctx, `DELETE FROM `+s.ident+` WHERE id = ANY($1)`, ids)
	if err != nil {
		return 0, s.wrap("delete", err)
	}
	return tag.RowsAffected(), nil
}
