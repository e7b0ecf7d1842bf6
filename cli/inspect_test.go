package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/cli"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/jackc/pgx/v5"
)

// custom is a strategy the CLI was not written for: an ID set under
// another name and table.
type custom struct{ *idset.Strategy }

func (custom) Name() string { return "custom" }

// A registered strategy is migrated, reported and swept through its
// interfaces alone.
func TestRegisteredStrategy(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s, err := idset.New(idset.Config{Table: "custom_markers", Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	opts := cli.Options{Strategies: map[string]dedupe.Strategy{"custom": custom{s}}}
	e.must(opts, "migrate", "--strategy", "custom", "--yes")
	ctx := context.Background()
	var keys []dedupe.Key
	for i := range 5 {
		keys = append(keys, dedupe.Key{Scope: "ledger", ID: fmt.Sprint(i)})
	}
	if err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		_, err := s.Claim(ctx, tx, keys)
		return err
	}); err != nil {
		t.Fatal(err)
	}

	var rep cli.StatsReport
	r := e.must(opts, "stats", "--strategy", "custom", "--json")
	if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, r.out)
	}
	if rep.Strategy != "custom" || rep.MarkersTable != "effectively.custom_markers" || len(rep.Scopes) != 1 ||
		rep.Scopes[0].Markers != 5 || rep.Scopes[0].NewestMarker == nil || rep.Details["retention"] != "1h0m0s" {
		t.Fatalf("stats of a registered strategy: %s", r.out)
	}

	if r := e.must(opts, "sweep", "--strategy", "custom", "--yes"); !strings.Contains(r.out, "no marker in effectively.custom_markers") {
		t.Fatalf("sweep of fresh markers: %s", r.out)
	}
	if _, err := e.pool.Exec(ctx, `UPDATE effectively.custom_markers SET processed_at = now() - interval '2 hours' WHERE id IN ('0', '1')`); err != nil {
		t.Fatal(err)
	}
	if r := e.must(opts, "sweep", "--strategy", "custom", "--yes"); !strings.Contains(r.out, "deleted 2 expired marker(s) from effectively.custom_markers") {
		t.Fatalf("sweep: %s", r.out)
	}
	if n := e.count(`SELECT count(*) FROM effectively.custom_markers`); n != 3 {
		t.Fatalf("%d markers left, want 3", n)
	}
}
