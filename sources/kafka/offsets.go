package kafka

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// offsetStore keeps (group, topic, partition) → next offset, generation.
type offsetStore struct {
	db     pg.DB
	group  string
	schema string
	table  string // raw name
	claimSQL,
	writeSQL,
	readSQL,
	positionsSQL string
	// claimIdle is the claim transaction's
	// idle_in_transaction_session_timeout.
	claimIdle time.Duration
}

// claimLockTimeout bounds how long a claim waits for a row lock: only a
// row another claim is inserting at the same moment makes it wait, since
// rows locked by a batch transaction are skipped and claimed again later.
const claimLockTimeout = time.Second

// claimIdleTimeout is the claim transaction's
// idle_in_transaction_session_timeout: a member frozen between the claim's
// statement and its COMMIT holds the rows it claimed locked, and the other
// members report them busy, until the server ends its session. It is below
// consumer.Config.IdleTxTimeout's default, so that the bound on a stall
// behind a frozen member (see the package doc) holds for a freeze in a
// claim too.
const claimIdleTimeout = 5 * time.Second

func newOffsetStore(db pg.DB, group, schema, table string) *offsetStore {
	t := pgx.Identifier{schema, table}.Sanitize()
	st := &offsetStore{
		db: db, group: group, schema: schema, table: table, claimIdle: claimIdleTimeout,
		// Claiming a partition on assignment raises the row's generation, so
		// a member of an older generation can no longer write it. A row
		// locked by a transaction in progress (a batch of an older
		// generation past BeforeCommit) is skipped and reported busy: the
		// caller claims it again once that transaction ended, and then reads
		// the offset it committed. So one locked row never holds up the
		// claim of the others.
		claimSQL: `WITH req AS (
  SELECT u.topic, u.partition FROM unnest($2::text[], $3::integer[]) AS u(topic, partition)
), free AS (
  SELECT o.topic, o.partition FROM ` + t + ` AS o JOIN req USING (topic, partition)
  WHERE o.group_id = $1
  FOR UPDATE OF o SKIP LOCKED
), busy AS (
  SELECT o.topic, o.partition FROM ` + t + ` AS o JOIN req USING (topic, partition)
  WHERE o.group_id = $1
  EXCEPT SELECT topic, partition FROM free
), claimed AS (
  INSERT INTO ` + t + ` AS o (group_id, topic, partition, next_offset, generation)
  SELECT $1, r.topic, r.partition, NULL, $4 FROM req AS r
  WHERE NOT EXISTS (SELECT FROM busy AS b WHERE b.topic = r.topic AND b.partition = r.partition)
  ORDER BY r.topic, r.partition
  ON CONFLICT (group_id, topic, partition) DO UPDATE
  SET generation = EXCLUDED.generation, updated_at = now()
  WHERE o.generation <= EXCLUDED.generation
  RETURNING o.topic, o.partition, o.next_offset, o.high_offset
)
SELECT topic, partition, next_offset, high_offset, false FROM claimed
UNION ALL
SELECT topic, partition, NULL, NULL, true FROM busy`,
		// Written in the batch transaction: only by the current generation,
		// only forward, and only over the offsets the writer knows are
		// stored ($6 and $8, -1 when it knows none): a row that holds less,
		// or is missing, went back behind the writer's back (a failover to
		// a standby that lacked the last commits, or a replay moving the
		// offsets back). The high offset ($7) moves with every batch, also
		// when a retry holds next_offset back, so that losing any commit
		// that wrote the row is seen. xmax = 0 tells a row inserted by this
		// statement.
		writeSQL: `INSERT INTO ` + t + ` AS o (group_id, topic, partition, next_offset, generation, high_offset)
VALUES ($1, $2, $3, $4, $5, $7)
ON CONFLICT (group_id, topic, partition) DO UPDATE
SET next_offset = GREATEST(o.next_offset, EXCLUDED.next_offset),
    high_offset = GREATEST(o.high_offset, EXCLUDED.high_offset),
    generation = EXCLUDED.generation, updated_at = now()
WHERE o.generation <= EXCLUDED.generation AND COALESCE(o.next_offset, -1) >= $6
  AND COALESCE(o.high_offset, -1) >= $8
RETURNING o.xmax = 0`,
		readSQL: `SELECT generation, next_offset, high_offset FROM ` + t + ` WHERE group_id = $1 AND topic = $2 AND partition = $3`,
		positionsSQL: `SELECT o.topic, o.partition, o.next_offset, o.high_offset FROM ` + t + ` AS o
JOIN unnest($2::text[], $3::integer[]) AS u(topic, partition) USING (topic, partition)
WHERE o.group_id = $1`,
	}
	return st
}

func (s *offsetStore) line() pg.Line { return OffsetsLine(s.schema, s.table) }

type topicPartition struct {
	topic     string
	partition int
}

// position is what the offsets table holds of a partition: next, the
// offset to consume from, and high, the offset after the highest record
// whose batch committed; -1 when none is stored.
type position struct{ next, high int64 }

// noPosition is a partition without a stored offset.
var noPosition = position{next: -1, high: -1}

// claim raises the generation of the given partitions' rows to gen and
// returns their stored positions (noPosition when none is stored), except for
// the rows another transaction holds locked (a batch of an earlier owner
// between BeforeCommit and its commit): those are returned in busy, to be
// claimed again later. Partitions whose row belongs to a newer generation
// are in neither.
func (s *offsetStore) claim(ctx context.Context, gen int32, tps []topicPartition) (claimed map[topicPartition]position, busy []topicPartition, err error) {
	topics := make([]string, len(tps))
	parts := make([]int32, len(tps))
	for i, tp := range tps {
		topics[i], parts[i] = tp.topic, int32(tp.partition)
	}
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, nil, s.wrap("claim partitions", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// Transaction-local, so that they hold through a transaction pooler.
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true), set_config('idle_in_transaction_session_timeout', $2, true)`,
		strconv.FormatInt(claimLockTimeout.Milliseconds(), 10), strconv.FormatInt(s.claimIdle.Milliseconds(), 10)); err != nil {
		return nil, nil, s.wrap("claim partitions", err)
	}
	rows, err := tx.Query(ctx, s.claimSQL, s.group, topics, parts, gen)
	if err != nil {
		return nil, nil, s.claimErr(err)
	}
	claimed = make(map[topicPartition]position, len(tps))
	for rows.Next() {
		var (
			tp         topicPartition
			p          int32
			next, high *int64
			locked     bool
		)
		if err := rows.Scan(&tp.topic, &p, &next, &high, &locked); err != nil {
			rows.Close()
			return nil, nil, s.wrap("claim partitions", err)
		}
		tp.partition = int(p)
		if locked {
			busy = append(busy, tp)
			continue
		}
		claimed[tp] = position{next: orNone(next), high: orNone(high)}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, s.claimErr(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, s.claimErr(err)
	}
	sortPartitions(busy)
	return claimed, busy, nil
}

// claimErr reports every partition busy when the claim timed out waiting
// for a lock (a row that another claim was inserting), and wraps other
// errors.
func (s *offsetStore) claimErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		return errClaimBusy
	}
	return s.wrap("claim partitions", err)
}

// errClaimBusy: a claim waited for a row lock for longer than
// claimLockTimeout; all its partitions are to be claimed again.
var errClaimBusy = errors.New("kafka: claim waited too long for a row lock")

func sortPartitions(tps []topicPartition) {
	sort.Slice(tps, func(i, j int) bool {
		if tps[i].topic != tps[j].topic {
			return tps[i].topic < tps[j].topic
		}
		return tps[i].partition < tps[j].partition
	})
}

// positions reads the stored positions of tps; a partition without a row
// is absent.
func (s *offsetStore) positions(ctx context.Context, tps []topicPartition) (map[topicPartition]position, error) {
	topics := make([]string, len(tps))
	parts := make([]int32, len(tps))
	for i, tp := range tps {
		topics[i], parts[i] = tp.topic, int32(tp.partition)
	}
	rows, err := s.db.Query(ctx, s.positionsSQL, s.group, topics, parts)
	if err != nil {
		return nil, s.wrap("read offsets", err)
	}
	defer rows.Close()
	out := make(map[topicPartition]position, len(tps))
	for rows.Next() {
		var tp topicPartition
		var p int32
		var next, high *int64
		if err := rows.Scan(&tp.topic, &p, &next, &high); err != nil {
			return nil, s.wrap("read offsets", err)
		}
		tp.partition = int(p)
		out[tp] = position{next: orNone(next), high: orNone(high)}
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("read offsets", err)
	}
	return out, nil
}

// behind reports whether found holds less than known, for either offset.
func behind(found, known position) bool { return found.next < known.next || found.high < known.high }

func orNone(off *int64) int64 {
	if off == nil {
		return -1
	}
	return *off
}

// write stores the position to for one partition in tx, over known, the
// position the writer knows the table holds (noPosition for none). It
// fails with an error wrapping consumer.ErrFenced when a newer generation
// owns the row, and with a *wentBackError (which wraps it too) when the
// row holds less than known or is gone.
func (s *offsetStore) write(ctx context.Context, tx pgx.Tx, tp topicPartition, gen int32, to, known position) error {
	var inserted bool
	args := []any{s.group, tp.topic, int32(tp.partition), to.next, gen, known.next, to.high, known.high}
	err := tx.QueryRow(ctx, s.writeSQL, args...).Scan(&inserted)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		var rowGen int32
		var rowNext, rowHigh *int64
		if err := tx.QueryRow(ctx, s.readSQL, s.group, tp.topic, int32(tp.partition)).Scan(&rowGen, &rowNext, &rowHigh); err != nil {
			return s.wrap("store offset", err)
		}
		if rowGen > gen {
			return fmt.Errorf("kafka: %s/%d of group %q is owned by a newer generation than %d: %w",
				tp.topic, tp.partition, s.group, gen, consumer.ErrFenced)
		}
		return &wentBackError{tp: tp, group: s.group, known: known, found: position{next: orNone(rowNext), high: orNone(rowHigh)}}
	case err != nil:
		return s.wrap("store offset", err)
	case inserted && (known.next >= 0 || known.high >= 0):
		return &wentBackError{tp: tp, group: s.group, known: known, found: noPosition}
	}
	return nil
}

// wentBackError: the offsets table holds less for a partition than its
// writer knows it stored, or nothing. The table went back behind the
// writer's back (a failover to a standby that lacked the last commits, or
// a replay moving the offsets back): the messages from the stored offset on
// are to be consumed again, which a member of a new generation does, from
// the offset it claims. It wraps consumer.ErrFenced: the batch is dropped.
type wentBackError struct {
	tp           topicPartition
	group        string
	known, found position
}

func (e *wentBackError) Error() string {
	if e.found.next >= e.known.next {
		return fmt.Sprintf("kafka: the offsets table shows commits of %s/%d of group %q up to offset %d, behind the %d this consumer committed (a database failover that lost commits): %v",
			e.tp.topic, e.tp.partition, e.group, e.found.high, e.known.high, consumer.ErrFenced)
	}
	return fmt.Sprintf("kafka: the offsets table holds %d for %s/%d of group %q, behind the %d this consumer stored (a database failover that lost commits, or a replay): %v",
		e.found.next, e.tp.topic, e.tp.partition, e.group, e.known.next, consumer.ErrFenced)
}

func (e *wentBackError) Unwrap() error { return consumer.ErrFenced }

func (s *offsetStore) wrap(what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") {
		return fmt.Errorf("kafka: %s: table %s is missing, run the consumer's Migrate first: %w",
			what, pgx.Identifier{s.schema, s.table}.Sanitize(), err)
	}
	return fmt.Errorf("kafka: %s in %s: %w", what, pgx.Identifier{s.schema, s.table}.Sanitize(), err)
}

// OffsetsLine returns the migration line of the offsets table
// schema.table, for pg.Migrate or pg.MigrationSQL, without a
// Source. schema defaults to "effectively" and table to "kafka_offsets",
// as in Config.
func OffsetsLine(schema, table string) pg.Line {
	schema, table = offsetsName(schema, table)
	sub, _ := fs.Sub(migrationFiles, "migrations")
	return pg.Line{Name: "kafka:" + table, FS: sub, Idents: map[string]string{"schema": schema, "table": table}}
}

func offsetsName(schema, table string) (string, string) {
	if schema == "" {
		schema = pg.DefaultSchema
	}
	if table == "" {
		table = "kafka_offsets"
	}
	return schema, table
}

// Offsets gives operations tools (a replay, a lag report) the offsets table
// that Sources keep in Postgres: (group, topic, partition) → next offset,
// generation. The table has this one owner; a Source uses it with
// generation fencing, Offsets reads it and moves offsets for a replay.
type Offsets struct {
	schema, table, ident string
}

// NewOffsets returns the offsets table schema.table; schema defaults to
// "effectively" and table to "kafka_offsets", as in Config.
func NewOffsets(schema, table string) *Offsets {
	schema, table = offsetsName(schema, table)
	return &Offsets{schema: schema, table: table, ident: pgx.Identifier{schema, table}.Sanitize()}
}

// Table returns the table's quoted name, schema.table.
func (o *Offsets) Table() string { return o.ident }

// Line returns the table's migration line.
func (o *Offsets) Line() pg.Line { return OffsetsLine(o.schema, o.table) }

// StoredOffset is one row of the offsets table.
type StoredOffset struct {
	Group     string
	Topic     string
	Partition int
	// Next is the next offset to consume; nil until a batch of the
	// partition committed (or after a replay created the row).
	Next *int64
	// Generation is the consumer group generation that last claimed or
	// wrote the row.
	Generation int32
	UpdatedAt  time.Time
}

// Querier runs a query: *pgxpool.Pool, *pgx.Conn and pgx.Tx have it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Exists reports whether the table exists.
func (o *Offsets) Exists(ctx context.Context, q Querier) (bool, error) {
	rows, err := q.Query(ctx, `SELECT to_regclass($1) IS NOT NULL`, o.ident)
	if err != nil {
		return false, fmt.Errorf("kafka: offsets table %s: %w", o.ident, err)
	}
	ok, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if err != nil {
		return false, fmt.Errorf("kafka: offsets table %s: %w", o.ident, err)
	}
	return ok, nil
}

const storedColumns = `group_id, topic, partition, next_offset, generation, updated_at`

func scanStored(r pgx.CollectableRow) (StoredOffset, error) {
	var so StoredOffset
	var p int32
	err := r.Scan(&so.Group, &so.Topic, &p, &so.Next, &so.Generation, &so.UpdatedAt)
	so.Partition = int(p)
	return so, err
}

func (o *Offsets) collect(rows pgx.Rows, err error) ([]StoredOffset, error) {
	if err != nil {
		return nil, fmt.Errorf("kafka: offsets table %s: %w", o.ident, err)
	}
	out, err := pgx.CollectRows(rows, scanStored)
	if err != nil {
		return nil, fmt.Errorf("kafka: offsets table %s: %w", o.ident, err)
	}
	return out, nil
}

// List returns the rows of group ("" for every group), ordered by group,
// topic and partition.
func (o *Offsets) List(ctx context.Context, q Querier, group string) ([]StoredOffset, error) {
	return o.collect(q.Query(ctx, `SELECT `+storedColumns+` FROM `+o.ident+`
WHERE $1 = '' OR group_id = $1 ORDER BY group_id, topic, partition`, group))
}

// Read returns the rows of group and topic for partitions, by partition;
// a partition without a row is absent.
func (o *Offsets) Read(ctx context.Context, q Querier, group, topic string, partitions []int) (map[int]StoredOffset, error) {
	return o.read(ctx, q, group, topic, partitions, "")
}

func (o *Offsets) read(ctx context.Context, q Querier, group, topic string, partitions []int, suffix string) (map[int]StoredOffset, error) {
	rows, err := o.collect(q.Query(ctx, `SELECT `+storedColumns+` FROM `+o.ident+`
WHERE group_id = $1 AND topic = $2 AND partition = ANY($3) ORDER BY partition`+suffix, group, topic, int32s(partitions)))
	if err != nil {
		return nil, err
	}
	out := make(map[int]StoredOffset, len(rows))
	for _, r := range rows {
		out[r.Partition] = r
	}
	return out, nil
}

// LockTx locks the rows of group and topic for partitions in tx, creating
// those that are missing (without an offset, generation 0), and returns
// them as Read does. A Source claiming these partitions meanwhile waits
// for tx; their generations are left alone, so the next generation claims
// the rows as usual and seeks to the offsets tx stored.
func (o *Offsets) LockTx(ctx context.Context, tx pgx.Tx, group, topic string, partitions []int) (map[int]StoredOffset, error) {
	if _, err := tx.Exec(ctx, `INSERT INTO `+o.ident+` (group_id, topic, partition, next_offset, generation)
SELECT $1, $2, p, NULL, 0 FROM unnest($3::integer[]) AS p ORDER BY p
ON CONFLICT (group_id, topic, partition) DO NOTHING`, group, topic, int32s(partitions)); err != nil {
		return nil, fmt.Errorf("kafka: offsets table %s: %w", o.ident, err)
	}
	return o.read(ctx, tx, group, topic, partitions, ` FOR UPDATE`)
}

// SeekTx stores next as the next offset of group and topic for each of its
// partitions whose row exists, in tx (lock them first with LockTx). It
// moves offsets backwards as well as forwards: a replay; a running Source
// only ever moves them forward.
func (o *Offsets) SeekTx(ctx context.Context, tx pgx.Tx, group, topic string, next map[int]int64) error {
	parts := make([]int32, 0, len(next))
	offs := make([]int64, 0, len(next))
	for p, off := range next {
		parts, offs = append(parts, int32(p)), append(offs, off)
	}
	if _, err := tx.Exec(ctx, `UPDATE `+o.ident+` AS o SET next_offset = u.target, updated_at = now()
FROM unnest($3::integer[], $4::bigint[]) AS u(partition, target)
WHERE o.group_id = $1 AND o.topic = $2 AND o.partition = u.partition`, group, topic, parts, offs); err != nil {
		return fmt.Errorf("kafka: offsets table %s: %w", o.ident, err)
	}
	return nil
}

func int32s(ps []int) []int32 {
	out := make([]int32, len(ps))
	for i, p := range ps {
		out[i] = int32(p)
	}
	return out
}
