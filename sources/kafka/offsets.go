package kafka

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// DB is what the Source needs of a database: *pgxpool.Pool has it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// offsetStore keeps (group, topic, partition) → next offset, generation.
type offsetStore struct {
	db     DB
	group  string
	schema string
	table  string // raw name
	claimSQL,
	writeSQL string
}

func newOffsetStore(db DB, group, schema, table string) *offsetStore {
	t := pgx.Identifier{schema, table}.Sanitize()
	return &offsetStore{
		db: db, group: group, schema: schema, table: table,
		// Claiming a partition on assignment raises the row's generation, so
		// a member of an older generation can no longer write it; the row
		// lock makes the claim wait for such a member's transaction in
		// progress and then read its committed offset.
		claimSQL: `INSERT INTO ` + t + ` AS o (group_id, topic, partition, next_offset, generation)
SELECT $1, u.topic, u.partition, NULL, $4
FROM unnest($2::text[], $3::integer[]) AS u(topic, partition)
ORDER BY u.topic, u.partition
ON CONFLICT (group_id, topic, partition) DO UPDATE
SET generation = EXCLUDED.generation, updated_at = now()
WHERE o.generation <= EXCLUDED.generation
RETURNING o.topic, o.partition, o.next_offset`,
		// Written in the batch transaction: only by the current generation,
		// and only forward.
		writeSQL: `INSERT INTO ` + t + ` AS o (group_id, topic, partition, next_offset, generation)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (group_id, topic, partition) DO UPDATE
SET next_offset = GREATEST(o.next_offset, EXCLUDED.next_offset),
    generation = EXCLUDED.generation, updated_at = now()
WHERE o.generation <= EXCLUDED.generation
RETURNING o.next_offset`,
	}
}

func (s *offsetStore) line() dedupe.Line {
	sub, _ := fs.Sub(migrationFiles, "migrations")
	return dedupe.Line{Name: "kafka:" + s.table, FS: sub, Idents: map[string]string{"table": s.table}}
}

type topicPartition struct {
	topic     string
	partition int
}

// claim raises the generation of the given partitions' rows to gen and
// returns their stored next offsets (-1 when none is stored). Partitions
// whose row belongs to a newer generation are missing from the result.
func (s *offsetStore) claim(ctx context.Context, gen int32, tps []topicPartition) (map[topicPartition]int64, error) {
	topics := make([]string, len(tps))
	parts := make([]int32, len(tps))
	for i, tp := range tps {
		topics[i], parts[i] = tp.topic, int32(tp.partition)
	}
	rows, err := s.db.Query(ctx, s.claimSQL, s.group, topics, parts, gen)
	if err != nil {
		return nil, s.wrap("claim partitions", err)
	}
	out := make(map[topicPartition]int64, len(tps))
	for rows.Next() {
		var (
			tp   topicPartition
			p    int32
			next *int64
		)
		if err := rows.Scan(&tp.topic, &p, &next); err != nil {
			rows.Close()
			return nil, s.wrap("claim partitions", err)
		}
		tp.partition = int(p)
		out[tp] = -1
		if next != nil {
			out[tp] = *next
		}
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("claim partitions", err)
	}
	return out, nil
}

// write stores next for one partition in tx; it fails with an error wrapping
// consumer.ErrFenced when a newer generation owns the row.
func (s *offsetStore) write(ctx context.Context, tx pgx.Tx, tp topicPartition, gen int32, next int64) error {
	var stored *int64
	err := tx.QueryRow(ctx, s.writeSQL, s.group, tp.topic, int32(tp.partition), next, gen).Scan(&stored)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("kafka: %s/%d of group %q is owned by a newer generation than %d: %w",
			tp.topic, tp.partition, s.group, gen, consumer.ErrFenced)
	}
	if err != nil {
		return s.wrap("store offset", err)
	}
	return nil
}

func (s *offsetStore) wrap(what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") {
		return fmt.Errorf("kafka: %s: table %s is missing, run (*Source).Migrate first: %w",
			what, pgx.Identifier{s.schema, s.table}.Sanitize(), err)
	}
	return fmt.Errorf("kafka: %s in %s: %w", what, pgx.Identifier{s.schema, s.table}.Sanitize(), err)
}
