package highwater_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/jackc/pgx/v5"
)

// TestRacingConsumers: several workers, in real concurrent transactions and
// through two Strategy values (two consumers with their own caches), claim
// overlapping windows of the same senders' seqs, and write one effect row
// per new key in the same transaction; a fifth of the transactions roll
// back. No seq is ever applied twice, and in strict mode every seq is
// applied exactly once and each mark ends at the last seq.
func TestRacingConsumers(t *testing.T) {
	for _, mode := range []highwater.Mode{highwater.Strict, highwater.Monotonic} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			const (
				senders = 6
				lastSeq = 30
				window  = 3
				workers = 4
			)
			pool, _ := newPool(t)
			ctx := context.Background()
			strategies := []*highwater.Strategy{
				newStrategy(t, pool, highwater.Config{Mode: mode}),
				newStrategy(t, pool, highwater.Config{Mode: mode}),
			}
			if _, err := pool.Exec(ctx, `CREATE TABLE effects (sender text NOT NULL, seq bigint NOT NULL, worker int NOT NULL)`); err != nil {
				t.Fatal(err)
			}

			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := strategies[w%len(strategies)]
					rng := rand.New(rand.NewPCG(uint64(w), 7))
					for start := int64(1); start <= lastSeq; {
						// Each worker walks the senders in its own order.
						var batch []dedupe.Key
						for _, sn := range rng.Perm(senders) {
							for seq := start; seq < start+window && seq <= lastSeq; seq++ {
								if mode == highwater.Monotonic && seq != start && rng.IntN(3) == 0 {
									continue // holes
								}
								batch = append(batch, key(fmt.Sprintf("s%d", sn), seq))
							}
						}
						ok, err := claimRace(ctx, pool, s, batch, w, rng.IntN(5) == 0)
						if err != nil {
							t.Errorf("worker %d: %v", w, err)
							return
						}
						if ok {
							start++
						}
					}
				}()
			}
			wg.Wait()

			var twice int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM effects GROUP BY sender, seq HAVING count(*) > 1) d`).Scan(&twice); err != nil {
				t.Fatal(err)
			}
			if twice != 0 {
				t.Errorf("%d seqs were applied more than once", twice)
			}
			var total, distinct int
			if err := pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (sender, seq)) FROM effects`).Scan(&total, &distinct); err != nil {
				t.Fatal(err)
			}
			if mode == highwater.Strict && (total != senders*lastSeq || distinct != senders*lastSeq) {
				t.Errorf("%d effects (%d distinct), want each of %d exactly once", total, distinct, senders*lastSeq)
			}
			for sender, mark := range marks(t, pool, "marks") {
				if mark != lastSeq {
					t.Errorf("mark of %s = %d, want %d", sender, mark, lastSeq)
				}
			}
			if n := len(marks(t, pool, "marks")); n != senders {
				t.Errorf("%d marks, want %d", n, senders)
			}
			t.Logf("%d effects; stats %+v and %+v", total, strategies[0].Stats(), strategies[1].Stats())
		})
	}
}

// claimRace claims batch in a transaction with one effect row per new key,
// and commits it, or rolls it back when rollback is set. It reports whether
// the transaction committed.
func claimRace(ctx context.Context, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, s *highwater.Strategy, batch []dedupe.Key, worker int, rollback bool) (bool, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx)
	verdicts, err := s.Claim(ctx, tx, batch)
	if err != nil {
		return false, err
	}
	var senders []string
	var seqs []int64
	for i, v := range verdicts {
		switch v {
		case dedupe.VerdictNew:
			senders = append(senders, batch[i].Sender)
			seqs = append(seqs, batch[i].Seq)
		case dedupe.VerdictGap:
			if s.Mode() == highwater.Monotonic {
				return false, fmt.Errorf("gap in monotonic mode for %v", batch[i])
			}
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO effects SELECT s, q, $3 FROM unnest($1::text[], $2::int8[]) AS u(s, q)`, senders, seqs, worker); err != nil {
		return false, err
	}
	if rollback {
		return false, tx.Rollback(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, err
	}
	s.Committed(batch, verdicts)
	return true, nil
}
