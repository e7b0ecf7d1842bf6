package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/cli"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/dedupe/switchover"
)

// A Migration registered with the CLI is migrated through it, and stats
// shows the switch: until when the old store is consulted, and how many
// markers it still holds and how recent they are, which says when it can
// be dropped.
func TestStatsShowsASwitchOfStrategy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	old, err := idset.New(idset.Config{Table: "old_markers", Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	nw, err := bloom.New(bloom.Config{Slice: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	since := time.Now().Truncate(time.Second)
	m, err := switchover.New(switchover.Config{Old: old, New: nw, Since: since})
	if err != nil {
		t.Fatal(err)
	}
	opts := cli.Options{Strategies: map[string]dedupe.Strategy{"ledger": m.Strategy()}}
	e.must(opts, "migrate", "--strategy", "ledger", "--yes")

	ctx := context.Background()
	var keys []dedupe.Key
	for i := range 4 {
		keys = append(keys, dedupe.Key{Scope: "ledger", ID: fmt.Sprint(i)})
	}
	if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := old.Claim(ctx, tx, keys) // recorded before the switch
		return err
	}); err != nil {
		t.Fatal(err)
	}

	var rep cli.StatsReport
	r := e.must(opts, "stats", "--strategy", "ledger", "--json")
	if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, r.out)
	}
	until := since.Add(time.Hour).Format(time.RFC3339)
	if rep.Strategy != "idset->bloom" || rep.Details["switchover_until"] != until || rep.Details["switchover_consulting"] != "true" ||
		rep.Details["switchover_old_markers"] != "4" || rep.Details["switchover_old_table"] != "effectively.old_markers" ||
		rep.Details["switchover_old_newest"] == "" {
		t.Fatalf("stats of a Migration: %s", r.out)
	}
	if r := e.must(opts, "stats", "--strategy", "ledger"); !strings.Contains(r.out, until) || !strings.Contains(r.out, "switchover_consulting") {
		t.Fatalf("stats of a Migration, as text, does not show until when the old store is consulted:\n%s", r.out)
	}
}
