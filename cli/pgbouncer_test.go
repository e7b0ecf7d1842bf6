package cli_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/effectively-once/effectively/cli"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// bouncerEnv is newEnv on a database reached through PgBouncer in
// transaction pooling mode; the commands' URL sets pgx's exec mode to
// exec, as the documentation asks.
func bouncerEnv(t *testing.T) *env {
	t.Helper()
	url := pgtest.BouncerURL(t) + "&default_query_exec_mode=exec"
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := pool.Exec(context.Background(), `CREATE TABLE effects (msg_id text NOT NULL, payload bytea NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, url: url, pool: pool}
}

var appliedCount = regexp.MustCompile(`applied (\d+) migration`)

// Two "migrate" runs at once through PgBouncer in transaction pooling
// apply each migration exactly once, and then there is nothing to do. The
// run that waited for the lock may hold a stale miss for the schema in its
// server connection's catalog cache (its listing of pending migrations
// looked the schema up), so its CREATE SCHEMA IF NOT EXISTS raises a
// unique violation in pg_namespace: Migrate runs its transaction again.
func TestMigrateTwiceAtOnceThroughPgBouncer(t *testing.T) {
	t.Parallel()
	e := bouncerEnv(t)
	var wg sync.WaitGroup
	outs := make([]result, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { outs[i], errs[i] = e.run(stock, "", "migrate", "--kafka", "--yes") })
	}
	wg.Wait()
	total := 0
	for i := range 2 {
		if errs[i] != nil {
			t.Fatalf("migrate %d: %v\n%s", i, errs[i], outs[i].err)
		}
		if m := appliedCount.FindStringSubmatch(outs[i].out); m != nil {
			n, _ := strconv.Atoi(m[1])
			total += n
		}
	}
	// The second run may have listed pending migrations before the first
	// committed; it then applies none of them.
	if total != 5 {
		t.Fatalf("%d migrations applied in all, want 5 (each once):\n%s\n%s", total, outs[0].out, outs[1].out)
	}
	if n := e.count(`SELECT count(*) FROM effectively.schema_migrations`); n != 5 {
		t.Fatalf("%d versions recorded, want 5", n)
	}
	if r := e.must(stock, "migrate", "--kafka", "--yes"); !appliedNone(r.out) {
		t.Fatalf("third migrate: %s", r.out)
	}
}

func appliedNone(out string) bool {
	m := appliedCount.FindStringSubmatch(out)
	return m == nil || m[1] == "0"
}

// Through a transaction pooler with pgx's default exec mode, "migrate"
// refuses, naming the connection-string setting to add.
func TestMigrateRefusesCachedStatementsThroughPgBouncer(t *testing.T) {
	t.Parallel()
	e := bouncerEnv(t)
	e.url = strings.TrimSuffix(e.url, "&default_query_exec_mode=exec")
	_, err := e.run(stock, "", "migrate", "--yes")
	if err == nil || !strings.Contains(err.Error(), "transaction mode") || !strings.Contains(err.Error(), "default_query_exec_mode=exec") {
		t.Fatalf("migrate: %v; want a refusal naming default_query_exec_mode=exec", err)
	}
	if n := e.count(`SELECT count(*) FROM pg_namespace WHERE nspname = 'effectively'`); n != 0 {
		t.Fatal("migrate created the schema before refusing")
	}
}

// A Kafka consumer, a replay and a redrive, all through PgBouncer in
// transaction pooling: the consumer parks every tenth message, the replay
// moves the group back to offset 0 and the consumer finds every message a
// duplicate, and the redrive, once the handler is fixed, applies the
// parked ones: every message has exactly one effect.
func TestReplayAndRedriveThroughPgBouncer(t *testing.T) {
	t.Parallel()
	e := newKenvOn(t, bouncerEnv(t), 2)
	key := func(i int) string { return fmt.Sprintf("k-%d", i) }
	bad := func(i int) bool { return i%10 == 7 }
	f := &fixable{}
	e.produce(0, 60, time.Now(), key, bad)
	if st := e.drain(f.handle); st.Applied != 54 || st.Parked != 6 {
		t.Fatalf("first run: %+v, want 54 applied and 6 parked", st)
	}
	e.replay("--to-offset", "0")
	for p, o := range e.storedOffsets() {
		if o != 0 {
			t.Fatalf("partition %d stored at %d after the replay, want 0", p, o)
		}
	}
	if st := e.drain(f.handle); st.Applied != 0 || st.Duplicate != 60 || st.Parked != 0 {
		t.Fatalf("after the replay: %+v, want 60 duplicates", st)
	}
	f.fix()
	ops := cli.Options{Handlers: map[string]consumer.Handler{"ledger": f.handle}}
	if r := e.must(ops, "parked", "redrive", "--scope", "ledger", "--handler", "ledger", "--yes"); !strings.Contains(r.out, "applied 6,") {
		t.Fatalf("redrive:\n%s", r.out)
	}
	if n := e.count(`SELECT count(DISTINCT msg_id) FROM effects`); n != 60 {
		t.Fatalf("%d messages have an effect, want 60", n)
	}
	if n := e.count(`SELECT count(*) FROM effects`); n != 60 {
		t.Fatalf("%d effect rows for 60 messages", n)
	}
}
