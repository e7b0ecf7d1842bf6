package dedupetest_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/dedupetest"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// broken strategies, each with the subtests that must catch it. A broken
// strategy is made from idset by wrap, or from highwater in monotonic mode
// by hw.
type brokenCase struct {
	wrap    func(*idset.Strategy) dedupe.Strategy
	catches []string
	hw      func(*highwater.Strategy) dedupe.Strategy
}

var broken = map[string]brokenCase{
	// Every key is new, as if markers were never found.
	"forgetful": {wrap: func(s *idset.Strategy) dedupe.Strategy {
		return mapped{s, func(_ []dedupe.Key, vs []dedupe.Verdict) { fill(vs, dedupe.VerdictNew) }}
	}, catches: []string{"NewThenDuplicate", "RollbackLeavesNoMarker"}},
	// Mismatches are reported as duplicates despite Fingerprints.
	"blind": {wrap: func(s *idset.Strategy) dedupe.Strategy {
		return mapped{s, func(_ []dedupe.Key, vs []dedupe.Verdict) {
			for i, v := range vs {
				if v == dedupe.VerdictMismatch {
					vs[i] = dedupe.VerdictDuplicate
				}
			}
		}}
	}, catches: []string{"MismatchAgainstCommittedMarker", "RepeatedKeysInBatch"}},
	// Mismatches are reported where the fingerprint is missing.
	"strict": {wrap: func(s *idset.Strategy) dedupe.Strategy {
		return mapped{s, func(ks []dedupe.Key, vs []dedupe.Verdict) {
			for i, v := range vs {
				if v == dedupe.VerdictDuplicate && len(ks[i].Fingerprint) == 0 {
					vs[i] = dedupe.VerdictMismatch
				}
			}
		}}
	}, catches: []string{"MissingFingerprintNeverMismatches"}},
	// Verdicts come back in the wrong order.
	"reversed": {wrap: func(s *idset.Strategy) dedupe.Strategy {
		return mapped{s, func(_ []dedupe.Key, vs []dedupe.Verdict) { slices.Reverse(vs) }}
	}, catches: []string{"MixedBatchInOrder"}},
	// Repeats within a batch are all new.
	"repeats": {wrap: func(s *idset.Strategy) dedupe.Strategy {
		return mapped{s, func(ks []dedupe.Key, vs []dedupe.Verdict) {
			for i := range vs {
				if vs[i] != dedupe.VerdictNew && slices.IndexFunc(ks[:i], func(k dedupe.Key) bool { return k.ID == ks[i].ID && k.Scope == ks[i].Scope }) >= 0 {
					vs[i] = dedupe.VerdictNew
				}
			}
		}}
	}, catches: []string{"RepeatedKeysInBatch"}},
	// Scopes are ignored.
	"scopeless": {wrap: func(s *idset.Strategy) dedupe.Strategy {
		return rescoped{s}
	}, catches: []string{"ScopesAreIndependent"}},
	// The context is ignored.
	"ctxless": {wrap: func(s *idset.Strategy) dedupe.Strategy {
		return ctxless{s}
	}, catches: []string{"CancelledContext"}},
	// Check, then insert: two transactions can both see a key as new.
	"racy": {wrap: func(*idset.Strategy) dedupe.Strategy {
		return racy{}
	}, catches: []string{"SecondClaimerWaitsForFirst", "ConcurrentClaimersOneKey", "ConcurrentOverlappingBatches"}},
}

// TestSuiteCatchesBrokenStrategies runs the suite against broken strategies
// in a child process and checks that the right subtests fail.
func TestSuiteCatchesBrokenStrategies(t *testing.T) {
	if os.Getenv("DEDUPETEST_BROKEN") != "" {
		t.Skip("child process")
	}
	server := pgtest.Server(t)
	for name, b := range broken {
		for _, sub := range b.catches {
			t.Run(name+"/"+sub, func(t *testing.T) {
				t.Parallel()
				cmd := exec.Command(os.Args[0], "-test.run", "^TestBroken$/^"+sub+"$", "-test.count=1")
				cmd.Env = append(os.Environ(), "DEDUPETEST_BROKEN="+name, "TEST_DATABASE_URL="+server)
				out, err := cmd.CombinedOutput()
				if err == nil {
					t.Fatalf("the suite passed strategy %q; subtest %s should have failed:\n%s", name, sub, out)
				}
				if !strings.Contains(string(out), "--- FAIL: TestBroken/"+sub) {
					t.Fatalf("strategy %q: subtest %s did not fail:\n%s", name, sub, out)
				}
			})
		}
	}
}

// TestBroken runs the suite against the broken strategy named by
// DEDUPETEST_BROKEN, in the child process.
func TestBroken(t *testing.T) {
	name := os.Getenv("DEDUPETEST_BROKEN")
	if name == "" {
		t.Skip("run by TestSuiteCatchesBrokenStrategies")
	}
	b, ok := broken[name]
	if !ok {
		t.Fatalf("unknown broken strategy %q", name)
	}
	if b.hw != nil {
		dedupetest.Run(t, dedupetest.Harness{
			New: func(t *testing.T) (dedupe.Strategy, *pgxpool.Pool) {
				pool := pgtest.NewPool(t)
				s, err := highwater.New(highwater.Config{Mode: highwater.Monotonic})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := pg.Migrate(context.Background(), pool, "", s.Migrations()...); err != nil {
					t.Fatal(err)
				}
				return b.hw(s), pool
			},
			Key: func(scope string, i int) dedupe.Key {
				return dedupe.Key{Scope: scope, Sender: "s", Seq: int64(i) + 1}
			},
		})
		return
	}
	dedupetest.Run(t, dedupetest.Harness{
		New: func(t *testing.T) (dedupe.Strategy, *pgxpool.Pool) {
			pool := pgtest.NewPool(t)
			s, err := idset.New(idset.Config{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pg.Migrate(context.Background(), pool, "", s.Migrations()...); err != nil {
				t.Fatal(err)
			}
			return b.wrap(s), pool
		},
		Key:          idKey,
		Fingerprints: true,
	})
}

func idKey(scope string, i int) dedupe.Key {
	return dedupe.Key{Scope: scope, ID: fmt.Sprintf("id-%d", i)}
}

func fill(vs []dedupe.Verdict, v dedupe.Verdict) {
	for i := range vs {
		vs[i] = v
	}
}

// mapped alters the verdicts of a working strategy.
type mapped struct {
	*idset.Strategy
	f func([]dedupe.Key, []dedupe.Verdict)
}

func (m mapped) Claim(ctx context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	vs, err := m.Strategy.Claim(ctx, tx, keys)
	if err == nil {
		m.f(keys, vs)
	}
	return vs, err
}

// rescoped puts every key in one scope.
type rescoped struct{ *idset.Strategy }

func (r rescoped) Claim(ctx context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	ks := slices.Clone(keys)
	for i := range ks {
		ks[i].Scope = "one"
	}
	return r.Strategy.Claim(ctx, tx, ks)
}

// ctxless claims with a context that is never cancelled.
type ctxless struct{ *idset.Strategy }

func (c ctxless) Claim(_ context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	return c.Strategy.Claim(context.Background(), tx, keys)
}

// racy looks for markers, then inserts the missing ones, and calls new
// whatever it did not see.
type racy struct{}

func (racy) Name() string { return "racy" }

func (racy) Claim(ctx context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	vs := make([]dedupe.Verdict, len(keys))
	seen := map[string]bool{}
	for i, k := range keys {
		id := k.Scope + "\x00" + k.ID
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM effectively.processed WHERE scope = $1 AND id = $2)`,
			k.Scope, k.ID).Scan(&exists); err != nil {
			return nil, err
		}
		if exists || seen[id] {
			vs[i] = dedupe.VerdictDuplicate
			continue
		}
		seen[id] = true
		if _, err := tx.Exec(ctx, `INSERT INTO effectively.processed (scope, id) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
			k.Scope, k.ID); err != nil {
			return nil, err
		}
		vs[i] = dedupe.VerdictNew
	}
	return vs, nil
}
