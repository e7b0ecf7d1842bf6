package cli_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/jackc/pgx/v5"
)

// Scenario (c): every effect was computed wrong. Replaying with the same
// scope would skip every message as a duplicate; replaying into a new scope
// applies every message again, and a handler that upserts keyed by the
// message replaces each wrong effect instead of adding a second one.
func TestReplayIntoNewScopeRecomputes(t *testing.T) {
	t.Parallel()
	e := newKenv(t, 2)
	if _, err := e.pool.Exec(context.Background(), `CREATE TABLE balances (msg_id text PRIMARY KEY, amount bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	key := func(i int) string { return fmt.Sprintf("t-%d", i) }
	e.produce(0, 40, time.Now(), key, nil)
	amount := func(m *consumer.Message) int64 {
		n, _ := strconv.ParseInt(strings.TrimPrefix(string(m.Value), "v-t-"), 10, 64)
		return n
	}
	buggy := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO balances (msg_id, amount) VALUES ($1, $2)`, m.ID, amount(m)*2)
		return err
	}
	fixed := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO balances (msg_id, amount) VALUES ($1, $2)
ON CONFLICT (msg_id) DO UPDATE SET amount = EXCLUDED.amount`, m.ID, amount(m))
		return err
	}
	if st := e.drain(buggy); st.Applied != 40 {
		t.Fatalf("first run: %+v", st)
	}

	// In the old scope, everything is already applied: a replay would do nothing.
	old := e.dryRun("--to-offset", "0")
	if old.Total.Applied != 40 || old.Total.New != 0 {
		t.Fatalf("dry run in the old scope: %+v", old.Total)
	}
	// In a new scope, everything is new.
	newScope := e.dryRun("--to-offset", "0", "--scope", "ledger-v2")
	if newScope.Total.New != 40 || newScope.Total.ReplayApplied != 40 {
		t.Fatalf("dry run in the new scope: %+v", newScope.Total)
	}
	e.replay("--to-offset", "0")
	// A producer sends once more while the fix is rolled out.
	e.produce(40, 50, time.Now(), key, nil)
	st := e.drainScope(fixed, "ledger-v2")
	if st.Applied != 50 || st.Duplicate != 0 {
		t.Fatalf("replay into the new scope: %+v", st)
	}
	var rows, sum int64
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*), sum(amount) FROM balances`).Scan(&rows, &sum); err != nil {
		t.Fatal(err)
	}
	if rows != 50 || sum != 49*50/2 {
		t.Fatalf("balances: %d rows summing to %d, want 50 rows summing to %d", rows, sum, 49*50/2)
	}
	// Redelivered again (a crash, another replay), the new scope's markers
	// make every message a duplicate.
	e.replay("--to-offset", "0")
	if st := e.drainScope(fixed, "ledger-v2"); st.Applied != 0 || st.Duplicate != 50 {
		t.Fatalf("second replay: %+v", st)
	}

	// A group that never ran gets rows at the replayed offsets, when
	// --new-group says that is meant.
	e.must(stock, "replay", "--brokers", strings.Join(e.k.Brokers(), ","), "--group", "fresh", "--topic", e.topic, "--to-offset", "0=3,1=4", "--new-group", "--yes")
	if n := e.count(`SELECT count(*) FROM effectively.kafka_offsets WHERE group_id = 'fresh' AND generation = 0
AND next_offset = CASE partition WHEN 0 THEN 3 ELSE 4 END`); n != 2 {
		t.Fatalf("fresh group: %d rows as expected, want 2", n)
	}
}
