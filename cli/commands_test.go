package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/effectively-once/effectively/cli"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/pg"
)

var stock = cli.Options{}

// migrate applies the parked, strategy and offsets lines once; the script
// of --print, applied by hand, leaves migrate nothing to do.
func TestMigrate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.must(stock, "migrate", "--kafka", "--yes")
	if !strings.Contains(r.out, "applied 5 migration(s)") {
		t.Fatalf("first migrate: %s", r.out)
	}
	for _, table := range []string{"effectively.parked", "effectively.processed", "effectively.kafka_offsets"} {
		if e.count(`SELECT count(*) FROM pg_tables WHERE schemaname || '.' || tablename = $1`, table) != 1 {
			t.Errorf("table %s missing", table)
		}
	}
	if r := e.must(stock, "migrate", "--kafka", "--yes"); !strings.Contains(r.out, "up to date") {
		t.Fatalf("second migrate: %s", r.out)
	}

	// By hand: print for highwater in another schema, run the script.
	r = e.must(stock, "migrate", "--print", "--kafka", "--strategy", "highwater", "--schema", "ops")
	if !strings.HasPrefix(r.out, "BEGIN;") || !strings.Contains(r.out, `"ops"."marks"`) {
		t.Fatalf("printed script:\n%s", r.out)
	}
	if _, err := e.pool.Exec(context.Background(), r.out); err != nil {
		t.Fatalf("applying the printed script: %v", err)
	}
	if r := e.must(stock, "migrate", "--kafka", "--strategy", "highwater", "--schema", "ops", "--yes"); !strings.Contains(r.out, "up to date") {
		t.Fatalf("migrate after the script: %s", r.out)
	}
	if e.count(`SELECT count(*) FROM pg_tables WHERE schemaname = 'ops'`) != 5 {
		t.Fatal("the script did not create the 5 tables of schema ops (schema_migrations, parked, marks, advances, kafka_offsets)")
	}

	// The outbox's tables come with --outbox, under --outbox-table (its four
	// migrations: the tables, the index of the rows that block a key, the
	// log relay's slots table and index, the log table).
	r = e.must(stock, "migrate", "--outbox", "--outbox-table", "orders_outbox", "--no-parked", "--no-strategy", "--yes")
	if !strings.Contains(r.out, "applied 4 migration(s)") {
		t.Fatalf("migrate --outbox: %s", r.out)
	}
	if e.count(`SELECT count(*) FROM pg_tables WHERE schemaname = 'effectively' AND tablename = 'orders_outbox'`) != 1 {
		t.Fatal("migrate --outbox did not create effectively.orders_outbox")
	}
	if r := e.must(stock, "migrate", "--outbox", "--outbox-table", "orders_outbox", "--yes"); !strings.Contains(r.out, "up to date") {
		t.Fatalf("second migrate --outbox: %s", r.out)
	}

	// The middleware's responses table comes with --idempotency, and a
	// middleware with the default Config finds nothing left to apply.
	r = e.must(stock, "migrate", "--idempotency", "--yes")
	if !strings.Contains(r.out, "applied 2 migration(s)") {
		t.Fatalf("migrate --idempotency: %s", r.out)
	}
	mw, err := idempotency.New(e.pool, idempotency.Config{SingleTenant: true})
	if err != nil {
		t.Fatal(err)
	}
	if pending, err := pg.PendingMigrations(context.Background(), e.pool, "", mw.Migrations()...); err != nil || len(pending) != 0 {
		t.Fatalf("the middleware's migrations after migrate --idempotency: %v pending, %v", pending, err)
	}
}

// A command that writes refuses without a terminal and without --yes; a
// "no" writes nothing; a "yes" writes.
func TestConfirmation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, err := e.run(stock, "y\n", "migrate")
	if err == nil || !strings.Contains(err.Error(), "not a terminal") || !strings.Contains(err.Error(), "--yes") {
		t.Fatalf("without a terminal: %v", err)
	}
	asking := cli.Options{AssumeTerminal: true}
	r, err := e.run(asking, "n\n", "migrate")
	if err == nil || !strings.Contains(err.Error(), "aborted") || !strings.Contains(r.err, "Apply 3 migration(s)? [y/N]") {
		t.Fatalf("answer no: %v, %q", err, r.err)
	}
	if e.count(`SELECT count(*) FROM pg_namespace WHERE nspname = 'effectively'`) != 0 {
		t.Fatal("an aborted migrate wrote")
	}
	if _, err := e.run(asking, "yes\n", "migrate"); err != nil {
		t.Fatal(err)
	}
	if e.count(`SELECT count(*) FROM effectively.schema_migrations`) != 3 {
		t.Fatal("a confirmed migrate did not apply")
	}
	if _, err := e.run(cli.Options{}, "", "stats", "--database-url", ""); err == nil {
		t.Fatal("stats without a database URL ran")
	}
}

// parked list, show and purge; redrive with the stock binary and with an
// embedded handler.
func TestParked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must(stock, "migrate", "--yes")
	f := &fixable{}
	e.consume("ledger", f.handle,
		consumer.Message{ID: "ok-1", Value: []byte("ok")},
		consumer.Message{ID: "bad-1", Value: []byte("bad one"), Headers: []consumer.Header{{Key: "trace", Value: []byte("t-1")}, {Key: "bin", Value: []byte{0xff, 0}}}},
		consumer.Message{ID: "bad-2", Value: []byte("bad two")},
		consumer.Message{Value: []byte("no key")},
	)
	e.consume("other", f.handle, consumer.Message{ID: "bad-3", Value: []byte{'b', 'a', 'd', 0xff}})

	r := e.must(stock, "parked", "list", "--scope", "ledger")
	if n := strings.Count(r.out, "\n"); n != 4 || !strings.Contains(r.out, "permanent") || !strings.Contains(r.out, "invalid_key") || strings.Contains(r.out, "bad-3") {
		t.Fatalf("list:\n%s", r.out)
	}
	var all []cli.ParkedMessage
	r = e.must(stock, "parked", "list", "--json")
	if err := json.Unmarshal([]byte(r.out), &all); err != nil || len(all) != 4 {
		t.Fatalf("list --json: %v\n%s", err, r.out)
	}
	var bad1, bad3 cli.ParkedMessage
	for _, p := range all {
		switch {
		case p.DedupeID != nil && *p.DedupeID == "bad-1":
			bad1 = p
		case p.DedupeID != nil && *p.DedupeID == "bad-3":
			bad3 = p
		}
	}
	if !bad3.PayloadBase64 || bad3.Payload != "YmFk/w==" {
		t.Fatalf("binary payload: %+v", bad3)
	}
	r = e.must(stock, "parked", "show", fmt.Sprint(bad1.ID))
	if !regexp.MustCompile(`(?m)^has marker: +true$`).MatchString(r.out) {
		t.Errorf("show does not say the row has a marker:\n%s", r.out)
	}
	for _, want := range []string{"bad one", `"t-1"`, "permanent: cannot handle bad one", "ledger"} {
		if !strings.Contains(r.out, want) {
			t.Errorf("show lacks %q:\n%s", want, r.out)
		}
	}
	if _, err := e.run(stock, "", "parked", "show", "999999"); err == nil || !strings.Contains(err.Error(), "no parked message with id 999999") {
		t.Fatalf("show of a missing id: %v", err)
	}

	// The stock binary cannot redrive: it has no handler, and says how to get one.
	_, err := e.run(stock, "", "parked", "redrive", "--scope", "ledger", "--handler", "ledger", "--yes")
	if err == nil || !strings.Contains(err.Error(), "no handlers registered") || !strings.Contains(err.Error(), "cli.NewRoot") {
		t.Fatalf("stock redrive: %v", err)
	}
	ops := cli.Options{Handlers: map[string]consumer.Handler{"ledger": f.handle}}
	if _, err := e.run(ops, "", "parked", "redrive", "--scope", "ledger", "--handler", "nope", "--yes"); err == nil || !strings.Contains(err.Error(), "registered handlers: ledger") {
		t.Fatalf("unknown handler: %v", err)
	}
	// Still broken: the rows stay parked and the command fails.
	r, err = e.run(ops, "", "parked", "redrive", "--scope", "ledger", "--handler", "ledger", "--reason", "permanent", "--yes")
	if err == nil || !strings.Contains(r.out, "failed 2") {
		t.Fatalf("redrive before the fix: %v\n%s", err, r.out)
	}
	// Fixed: two redrives at once apply each message once.
	f.fix()
	var wg sync.WaitGroup
	outs := make([]string, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := e.run(ops, "", "parked", "redrive", "--scope", "ledger", "--handler", "ledger", "--reason", "permanent", "--yes")
			if err != nil {
				t.Errorf("redrive %d: %v", i, err)
			}
			outs[i] = r.out
		}()
	}
	wg.Wait()
	if n := e.count(`SELECT count(*) FROM effects WHERE msg_id IN ('bad-1', 'bad-2')`); n != 2 {
		t.Fatalf("%d effects of bad-1 and bad-2 after two redrives, want 2:\n%s\n%s", n, outs[0], outs[1])
	}
	if n := e.count(`SELECT count(*) FROM effects WHERE msg_id = 'bad-1' AND payload = 'bad one'`); n != 1 {
		t.Fatal("bad-1's payload did not survive the parking")
	}
	// The key-less row is skipped without --key, and stays.
	r = e.must(ops, "parked", "redrive", "--scope", "ledger", "--handler", "ledger", "--yes")
	if !strings.Contains(r.out, "skipped 1") {
		t.Fatalf("key-less redrive:\n%s", r.out)
	}
	if r := e.must(ops, "parked", "redrive", "--scope", "ledger", "--handler", "ledger", "--key", "json:id", "--yes"); !strings.Contains(r.out, "skipped 1") {
		t.Fatalf("redrive with a key function that fails:\n%s", r.out)
	}

	// Purge: refuses without a filter, deletes what it selects.
	if _, err := e.run(stock, "", "parked", "purge", "--yes"); err == nil || !strings.Contains(err.Error(), "no filter") {
		t.Fatalf("purge without a filter: %v", err)
	}
	if _, err := e.run(stock, "", "parked", "purge", "--scope", "other"); err == nil || !strings.Contains(err.Error(), "--yes") {
		t.Fatalf("purge without --yes: %v", err)
	}
	r = e.must(stock, "parked", "purge", "--scope", "other", "--yes")
	if !strings.Contains(r.out, "purged 1") || e.count(`SELECT count(*) FROM effectively.parked WHERE scope = 'other'`) != 0 {
		t.Fatalf("purge: %s", r.out)
	}
	if r := e.must(stock, "parked", "purge", "--scope", "other", "--yes"); !strings.Contains(r.out, "no parked message matches") {
		t.Fatalf("second purge: %s", r.out)
	}
	if n := e.count(`SELECT count(*) FROM effectively.parked`); n != 1 {
		t.Fatalf("%d rows left, want the key-less one", n)
	}
	r = e.must(stock, "parked", "purge", "--all", "--older-than", "1h", "--yes")
	if !strings.Contains(r.out, "no parked message matches") {
		t.Fatalf("purge of rows older than an hour: %s", r.out)
	}
}

// stats reports markers and parked messages per scope, and table sizes.
func TestStats(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if _, err := e.run(stock, "", "stats"); err != nil {
		t.Fatalf("stats before migrate: %v", err)
	}
	e.must(stock, "migrate", "--kafka", "--yes")
	f := &fixable{}
	e.consume("ledger", f.handle,
		consumer.Message{ID: "1", Value: []byte("ok")},
		consumer.Message{ID: "2", Value: []byte("ok")},
		consumer.Message{ID: "3", Value: []byte("bad")},
		consumer.Message{Value: []byte("no key")},
	)
	e.consume("audit", insertEffect, consumer.Message{ID: "1", Value: []byte("ok")})
	var rep cli.StatsReport
	r := e.must(stock, "stats", "--json")
	if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, r.out)
	}
	if len(rep.Scopes) != 2 || rep.Scopes[0].Scope != "audit" || rep.Scopes[1].Scope != "ledger" {
		t.Fatalf("scopes %+v", rep.Scopes)
	}
	ledger := rep.Scopes[1]
	if ledger.Markers != 3 || ledger.Parked != 2 || ledger.ParkedBy["permanent"] != 1 || ledger.ParkedBy["invalid_key"] != 1 || ledger.OldestMarker == nil {
		t.Fatalf("ledger %+v", ledger)
	}
	if rep.Scopes[0].Markers != 1 || rep.Scopes[0].Parked != 0 {
		t.Fatalf("audit %+v", rep.Scopes[0])
	}
	if len(rep.Tables) != 3 || !rep.Tables[0].Exists || rep.Tables[0].Bytes == 0 {
		t.Fatalf("tables %+v", rep.Tables)
	}
	r = e.must(stock, "stats", "--scope", "ledger")
	if !strings.Contains(r.out, "invalid_key=1 permanent=1") || strings.Contains(r.out, "audit") || !strings.Contains(r.out, `"effectively"."processed"`) {
		t.Fatalf("stats table:\n%s", r.out)
	}
}

// sweep deletes the markers older than the retention, and only those.
func TestSweep(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must(stock, "migrate", "--yes")
	var msgs []consumer.Message
	for i := range 30 {
		msgs = append(msgs, consumer.Message{ID: fmt.Sprint(i), Value: []byte("x")})
	}
	e.consume("ledger", insertEffect, msgs...)
	if _, err := e.pool.Exec(context.Background(), `UPDATE effectively.processed SET processed_at = now() - interval '20 days' WHERE id::int < 12`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.run(stock, "", "sweep", "--retention", "240h"); err == nil || !strings.Contains(err.Error(), "--yes") {
		t.Fatalf("sweep without --yes: %v", err)
	}
	r := e.must(stock, "sweep", "--retention", "240h", "--yes")
	if !strings.Contains(r.out, "deleted 12 expired marker(s)") {
		t.Fatalf("sweep: %s", r.out)
	}
	if n := e.count(`SELECT count(*) FROM effectively.processed`); n != 18 {
		t.Fatalf("%d markers left, want 18", n)
	}
	if r := e.must(stock, "sweep", "--retention", "240h", "--yes"); !strings.Contains(r.out, "no marker") {
		t.Fatalf("second sweep: %s", r.out)
	}
	if _, err := e.run(stock, "", "sweep", "--strategy", "highwater", "--yes"); err == nil || !strings.Contains(err.Error(), "do not expire") {
		t.Fatalf("highwater sweep: %v", err)
	}
}

// With the bloom strategy, migrate creates the partitioned table, sweep runs
// its maintenance (which creates the current partitions), and stats sums
// the partitions' sizes.
func TestBloomSweepAndStats(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.must(stock, "migrate", "--strategy", "bloom", "--yes")
	r := e.must(stock, "sweep", "--strategy", "bloom", "--yes")
	if !strings.Contains(r.out, "0 partition(s) before") {
		t.Fatalf("sweep: %s", r.out)
	}
	if n := e.count(`SELECT count(*) FROM pg_partition_tree('effectively.bloom_markers') WHERE isleaf`); n < 2 {
		t.Fatalf("%d partitions after maintenance", n)
	}
	var rep cli.StatsReport
	r = e.must(stock, "stats", "--strategy", "bloom", "--json")
	if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Strategy != "bloom" || rep.MarkersTable != "effectively.bloom_markers" || !rep.Tables[0].Exists || rep.Tables[0].Bytes == 0 {
		t.Fatalf("stats %+v", rep)
	}
}

// Bad flags are refused before anything is read or written.
func TestFlagErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	replay := []string{"replay", "--brokers", "127.0.0.1:1", "--group", "g", "--topic", "t"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "--group", "g", "--topic", "t", "--to-offset", "0"}, "--brokers is required"},
		{replay, "exactly one of --to-time and --to-offset"},
		{append(replay[:len(replay):len(replay)], "--to-offset", "0", "--to-time", "1h"), "exactly one of"},
		{append(replay[:len(replay):len(replay)], "--to-offset", "0", "--dry-run"), "--scope is required with --dry-run"},
		{append(replay[:len(replay):len(replay)], "--to-offset", "0", "--progress", "sometimes"), "--progress"},
		{[]string{"stats", "--strategy", "nope"}, `unknown strategy "nope"`},
		{[]string{"stats", "--strategy", "highwater", "--highwater-mode", "loose"}, "neither strict nor monotonic"},
		{[]string{"parked", "redrive", "--handler", "x"}, "--scope is required"},
		{[]string{"parked", "show", "abc"}, "not a parked-row id"},
		{[]string{"parked", "list", "--id", "x"}, "invalid argument"},
	} {
		if _, err := e.run(stock, "", c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want %q", c.args, err, c.want)
		}
	}
}
