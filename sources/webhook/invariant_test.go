package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/sources/webhook"
	"github.com/jackc/pgx/v5"
)

// TestInvariant: 2,000 logical events, each delivered one to three times
// by concurrent clients in random order, some of whose handlers fail at
// their first attempt (the provider retries them after the 500), some
// poison (parked), and some of whose deliveries the client abandons
// midway (the provider retries those too): every event ends with exactly
// one outcome, an effect row or a parked row, and every 200 arrives when
// that outcome is already in Postgres.
func TestInvariant(t *testing.T) {
	if testing.Short() {
		t.Skip("the invariant run takes a few seconds")
	}
	t.Parallel()
	const n = 2000
	kind := func(id string) uint32 {
		h := fnv.New32a()
		h.Write([]byte(id))
		return h.Sum32() % 100
	}
	var failures atomic.Int64
	handler := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch k := kind(m.DedupeKey.ID); {
		case k < 2:
			return consumer.Permanent(errors.New("poison"))
		case k < 7 && m.Attempt == 1:
			failures.Add(1)
			return errors.New("transient failure at the first attempt")
		}
		return insertEffect(ctx, tx, m)
	}
	e := newEnv(t, webhook.Config{}, consumer.Config{Handler: handler, BatchSize: 50})
	e.start()

	rng := rand.New(rand.NewPCG(18, 2))
	var deliveries []string
	poison := 0
	for i := range n {
		id := fmt.Sprintf("evt_%05d", i)
		if kind(id) < 2 {
			poison++
		}
		for range 1 + rng.IntN(3) {
			deliveries = append(deliveries, id)
		}
	}
	rng.Shuffle(len(deliveries), func(i, j int) { deliveries[i], deliveries[j] = deliveries[j], deliveries[i] })

	var (
		next                        atomic.Int64
		answered, retried, abandons atomic.Int64
		wg                          sync.WaitGroup
	)
	for w := range 32 {
		r := rand.New(rand.NewPCG(uint64(w), 99))
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(deliveries) || t.Failed() {
					return
				}
				id := deliveries[i]
				body := event(id, len(id)) // every delivery of an event carries the same body
				for try := 0; ; try++ {
					if try == 50 {
						t.Errorf("%s: no 200 after 50 deliveries", id)
						return
					}
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					if r.IntN(20) == 0 {
						// A provider that gives up on this delivery.
						ctx, cancel = context.WithTimeout(ctx, time.Duration(r.IntN(20))*time.Millisecond)
					}
					rep := e.do(ctx, http.MethodPost, body, stripeSign(testSecret, time.Now(), body))
					gaveUp := ctx.Err() != nil
					cancel()
					if gaveUp && rep.status == 0 {
						abandons.Add(1)
						continue
					}
					if rep.status != http.StatusOK {
						if rep.status != http.StatusInternalServerError {
							t.Errorf("%s: answered %d %q", id, rep.status, rep.body)
							return
						}
						retried.Add(1)
						continue
					}
					answered.Add(1)
					if got := e.outcomes(id); got != 1 {
						t.Errorf("%s answered 200 with %d outcomes in Postgres, want 1", id, got)
					}
					break
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	counts := e.effectCounts()
	parked := map[string]int{}
	for _, p := range e.parked() {
		parked[deref(p.DedupeID)]++
	}
	for i := range n {
		id := fmt.Sprintf("evt_%05d", i)
		if counts[id]+parked[id] != 1 {
			t.Errorf("%s: %d effects and %d parked rows, want one outcome", id, counts[id], parked[id])
		}
	}
	if len(counts) != n-poison || len(parked) != poison {
		t.Errorf("effects of %d events and %d parked, want %d and %d", len(counts), len(parked), n-poison, poison)
	}
	res := e.results()
	st := e.hooks.Total()
	t.Logf("%d events (%d poison) in %d deliveries: %d answered 200, %d answered 500, %d abandoned by their client (%d taken off the queue); consumer: %v",
		n, poison, len(deliveries), answered.Load(), retried.Load(), abandons.Load(), res[webhook.ResultGone], st)
	if failures.Load() == 0 || retried.Load() == 0 || abandons.Load() == 0 || st.Duplicate == 0 || st.Parked != poison || st.Mismatch != 0 {
		t.Errorf("the run did not exercise failures, retries, abandons, duplicates and poison (or saw mismatches)")
	}
}

// outcomes returns the effect rows and parked rows of event id.
func (e *env) outcomes(id string) int {
	var n int
	err := e.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM effects WHERE event_id = $1)
		+ (SELECT count(*) FROM effectively.parked WHERE dedupe_id = $1)`, id).Scan(&n)
	if err != nil {
		e.t.Error(err)
	}
	return n
}
