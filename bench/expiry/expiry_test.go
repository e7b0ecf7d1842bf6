package expiry_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/effectively-once/effectively/bench/expiry"
	"github.com/effectively-once/effectively/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestRunTiny runs the whole benchmark at a tiny scale: it loads both
// tables, warms bloom, claims, expires a slice of each strategy alone and
// another under claims (Run itself fails unless every claimed key is new,
// bloom's maintenance drops exactly the oldest partition and idset's sweep
// deletes exactly that slice's rows), and prints the table.
func TestRunTiny(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()
	cfg := expiry.Config{
		Markers:   7_003,
		Batch:     100,
		ClaimKeys: 1_000,
		Runs:      1,
		Steady:    100 * time.Millisecond,
		MinWindow: 100 * time.Millisecond,
		Logf:      t.Logf,
	}
	res, err := expiry.Run(ctx, pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.PerSlice != 1_003 { // the oldest slice takes the remainder
		t.Errorf("PerSlice = %d, want 1003", res.PerSlice)
	}
	for name, e := range map[string]expiry.Expiry{"bloom": res.Bloom.Expiry, "idset": res.Idset.Expiry} {
		if e.Removed != int64(res.PerSlice) || e.WALBytes <= 0 || e.Took <= 0 {
			t.Errorf("%s expiry: %+v", name, e)
		}
	}
	var left [2]int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM expiry_bench.bloom_markers), (SELECT count(*) FROM expiry_bench.processed)`).Scan(&left[0], &left[1]); err != nil {
		t.Fatal(err)
	}
	// The oldest slice and then three more expired in bloom's table, the
	// two oldest in idset's; every claimed key left a marker.
	if want := 3_000 + res.Bloom.Claimed; left[0] != want {
		t.Errorf("bloom: %d markers left, want %d", left[0], want)
	}
	if want := 5_000 + res.Idset.Claimed; left[1] != want {
		t.Errorf("idset: %d markers left, want %d", left[1], want)
	}
	if res.Filter.SealedKeys != 7_003 || res.Filter.Tests == 0 || res.Bloom.Rate <= 0 || res.Idset.Rate <= 0 {
		t.Errorf("filter %+v, rates %v / %v", res.Filter, res.Bloom.Rate, res.Idset.Rate)
	}
	var out bytes.Buffer
	res.Markdown(&out)
	if !strings.Contains(out.String(), "| (a) claim throughput") || !strings.Contains(out.String(), "Targets:") {
		t.Errorf("table:\n%s", out.String())
	}
	t.Log("\n" + out.String())
}
