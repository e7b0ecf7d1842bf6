package webhook

import (
	"context"
	"embed"
	"io/fs"
	"sync/atomic"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
)

// storeTimeout bounds a read or a write of counts: an unreachable database
// must not hold a batch's answers for long (the counts go on in memory).
const storeTimeout = 2 * time.Second

//go:embed migrations/*.sql
var migrationFiles embed.FS

// sweepEvery is how often the rows of events not delivered for longer than
// the redelivery horizon are deleted, with a batch's counts.
const sweepEvery = time.Hour

// AttemptsLine returns the migration line of the attempts table in schema
// (pg.DefaultSchema when empty), named table ("webhook_attempts" when
// empty), for pg.Migrate or pg.MigrationSQL. A consumer's Migrate
// applies it with the consumer's other tables when Config.DB is set.
func AttemptsLine(schema, table string) pg.Line {
	if schema == "" {
		schema = pg.DefaultSchema
	}
	if table == "" {
		table = DefaultAttemptsTable
	}
	sub, _ := fs.Sub(migrationFiles, "migrations")
	return pg.Line{Name: "webhook:" + table, FS: sub, Idents: map[string]string{
		"schema": schema, "table": table, "index": table + "_updated_at",
	}}
}

// attemptStore keeps, in Postgres, the unacknowledged deliveries of each
// event (Config.DB), so that counts survive a restart and are shared by
// the processes behind a load balancer. It is read once per batch, when
// the batch is fetched, and written once the batch settled.
type attemptStore struct {
	db        pg.DB
	name      string
	horizon   time.Duration
	line      pg.Line
	readSQL   string
	writeSQL  string
	lastSweep atomic.Int64 // unix nanoseconds
}

func newAttemptStore(cfg Config) *attemptStore {
	t := pgx.Identifier{cfg.Schema, cfg.AttemptsTable}.Sanitize()
	return &attemptStore{
		db: cfg.DB, name: cfg.Name, horizon: cfg.RedeliveryHorizon,
		line:    AttemptsLine(cfg.Schema, cfg.AttemptsTable),
		readSQL: `SELECT event_id, attempts FROM ` + t + ` WHERE source = $1 AND event_id = ANY($2::text[])`,
		// Acknowledged events ($2) are forgotten, retried ones ($3, $4)
		// counted, and, when $5, rows untouched for longer than the
		// redelivery horizon swept (never one counted here: a statement
		// must not touch a row twice).
		writeSQL: `WITH gone AS (
  DELETE FROM ` + t + ` WHERE source = $1 AND (event_id = ANY($2::text[])
    OR ($5::boolean AND updated_at < now() - $6::interval AND NOT event_id = ANY($3::text[])))
)
INSERT INTO ` + t + ` AS a (source, event_id, attempts)
SELECT $1, u.id, u.n FROM unnest($3::text[], $4::integer[]) AS u(id, n)
ON CONFLICT (source, event_id) DO UPDATE SET attempts = GREATEST(a.attempts, EXCLUDED.attempts), updated_at = now()`,
	}
}

// load raises the Attempt of msgs to one more than the stored count of
// their event, where that is more than this process counted.
func (st *attemptStore) load(ctx context.Context, msgs []*consumer.Message) error {
	ids := make([]string, 0, len(msgs))
	for _, m := range msgs {
		if m.ID != "" {
			ids = append(ids, m.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	rows, err := st.db.Query(ctx, st.readSQL, st.name, ids)
	if err != nil {
		return err
	}
	stored := map[string]int{}
	for rows.Next() {
		var id string
		var n int32
		if err := rows.Scan(&id, &n); err != nil {
			rows.Close()
			return err
		}
		stored[id] = int(n)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, m := range msgs {
		if n, ok := stored[m.ID]; ok && m.ID != "" && n+1 > m.Attempt {
			m.Attempt = n + 1
		}
	}
	return nil
}

// write records a settled batch's outcome: acknowledged events are
// forgotten and retried ones counted at their Attempt, in one statement
// (none for a batch of first deliveries all acknowledged, unless a sweep
// is due). It runs after the batch's transaction, before the requests are
// answered, so a provider's next delivery finds the count.
func (st *attemptStore) write(ctx context.Context, acked, retried []*consumer.Message) error {
	forget := map[string]bool{}
	count := map[string]int{}
	for _, m := range acked {
		if m.ID != "" && m.Attempt > 1 {
			forget[m.ID] = true
		}
	}
	for _, m := range retried {
		if m.ID != "" {
			count[m.ID] = max(count[m.ID], m.Attempt)
		}
	}
	var gone, ids []string
	var ns []int32
	for id := range forget {
		gone = append(gone, id)
		delete(count, id) // one delivery acknowledged: the event is done
	}
	for id, n := range count {
		ids, ns = append(ids, id), append(ns, int32(n))
	}
	now := time.Now()
	sweep := now.UnixNano()-st.lastSweep.Load() > int64(sweepEvery)
	if len(gone) == 0 && len(ids) == 0 && !sweep {
		return nil
	}
	if _, err := st.db.Exec(ctx, st.writeSQL, st.name, gone, ids, ns, sweep, st.horizon); err != nil {
		return err
	}
	if sweep {
		st.lastSweep.Store(now.UnixNano())
	}
	return nil
}
