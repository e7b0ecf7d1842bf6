package highwater_test

import (
	"context"
	"maps"
	"testing"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// delivery is one message of the issue's scenario: sender, seq and the
// delta its effect adds to the total.
type delivery struct {
	sender string
	seq    int64
	delta  int64
}

var scenario = []delivery{{"a", 1, 10}, {"a", 2, 5}, {"a", 2, 5}, {"b", 1, 7}, {"a", 4, 1}, {"a", 1, 10}, {"a", 3, 2}}

const scenarioVerdicts = "new new duplicate new gap duplicate new"

func setupTotal(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), `CREATE TABLE total (id int PRIMARY KEY, total bigint NOT NULL);
INSERT INTO total VALUES (1, 0)`); err != nil {
		t.Fatal(err)
	}
}

func readTotal(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var total int64
	if err := pool.QueryRow(context.Background(), `SELECT total FROM total WHERE id = 1`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	return total
}

// claimDeliveries claims ds as one batch and adds the deltas of the new
// ones to the total in the same transaction.
func claimDeliveries(t *testing.T, pool *pgxpool.Pool, s *highwater.Strategy, ds ...delivery) []dedupe.Verdict {
	t.Helper()
	keys := make([]dedupe.Key, len(ds))
	for i, d := range ds {
		keys[i] = key(d.sender, d.seq)
	}
	return claimTx(t, pool, s, keys, func(tx pgx.Tx, verdicts []dedupe.Verdict) error {
		var sum int64
		for i, v := range verdicts {
			if v == dedupe.VerdictNew {
				sum += ds[i].delta
			}
		}
		_, err := tx.Exec(context.Background(), `UPDATE total SET total = total + $1 WHERE id = 1`, sum)
		return err
	})
}

// TestIssueScenario runs the delivery of the issue, one message per claim
// and as one batch, with and without the cache: verdicts "new new duplicate
// new gap duplicate new", total 24, marks {a:3, b:1}; then redelivering
// (a,4,1) applies it and the total is 25.
func TestIssueScenario(t *testing.T) {
	for _, tc := range []struct {
		name      string
		oneBatch  bool
		cacheSize int
	}{
		{"per-message", false, 0},
		{"per-message-no-cache", false, -1},
		{"one-batch", true, 0},
		{"one-batch-no-cache", true, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, _ := newPool(t)
			s := newStrategy(t, pool, highwater.Config{CacheSize: tc.cacheSize})
			setupTotal(t, pool)

			var verdicts []dedupe.Verdict
			if tc.oneBatch {
				verdicts = claimDeliveries(t, pool, s, scenario...)
			} else {
				for _, d := range scenario {
					verdicts = append(verdicts, claimDeliveries(t, pool, s, d)...)
				}
			}
			if got := verdictNames(verdicts); got != scenarioVerdicts {
				t.Errorf("verdicts = %q, want %q", got, scenarioVerdicts)
			}
			if got := readTotal(t, pool); got != 24 {
				t.Errorf("total = %d, want 24", got)
			}
			if got, want := marks(t, pool, "marks"), map[string]int64{"a": 3, "b": 1}; !maps.Equal(got, want) {
				t.Errorf("marks = %v, want %v", got, want)
			}

			// The gap was not acknowledged: its redelivery now applies.
			if got := verdictNames(claimDeliveries(t, pool, s, delivery{"a", 4, 1})); got != "new" {
				t.Errorf("redelivered (a,4,1): %s, want new", got)
			}
			if got := readTotal(t, pool); got != 25 {
				t.Errorf("total = %d, want 25", got)
			}
			if got, want := marks(t, pool, "marks"), map[string]int64{"a": 4, "b": 1}; !maps.Equal(got, want) {
				t.Errorf("marks = %v, want %v", got, want)
			}
			// And again it is a duplicate.
			if got := verdictNames(claimDeliveries(t, pool, s, delivery{"a", 4, 1})); got != "duplicate" {
				t.Errorf("(a,4,1) once more: %s, want duplicate", got)
			}
			if got := readTotal(t, pool); got != 25 {
				t.Errorf("total = %d, want 25", got)
			}
		})
	}
}
