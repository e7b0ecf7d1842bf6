package expiry

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/effectively-once/effectively/dedupe"
)

// claimer claims batches of new keys with one strategy, one transaction a
// batch, as the consumer does, and reports the commit to the strategy
// when it is a dedupe.Committer.
type claimer struct {
	name  string
	s     dedupe.Strategy
	batch int
	next  int // new keys handed out so far
	rates []float64
}

// newKeys returns the next n new keys: ids of 32 hex digits, like the
// loaded markers' but from a different sequence, so none was seen before.
// Both strategies get the same sequence.
func (c *claimer) newKeys(n int) []dedupe.Key {
	keys := make([]dedupe.Key, n)
	for i := range keys {
		sum := md5.Sum([]byte("n" + strconv.Itoa(c.next)))
		c.next++
		id := hex.EncodeToString(sum[:])
		keys[i] = dedupe.Key{Scope: Scope, ID: id, Fingerprint: dedupe.Fingerprint([]byte(id))}
	}
	return keys
}

// claimBatch claims one batch of new keys in a transaction and commits
// it; every verdict must be new.
func (c *claimer) claimBatch(ctx context.Context, pool *pgxpool.Pool) error {
	keys := c.newKeys(c.batch)
	var vs []dedupe.Verdict
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		vs, err = c.s.Claim(ctx, tx, keys)
		return err
	})
	if err != nil {
		return fmt.Errorf("expiry: %s claim: %w", c.name, err)
	}
	for i, v := range vs {
		if v != dedupe.VerdictNew {
			return fmt.Errorf("expiry: %s: new key %s got verdict %v", c.name, keys[i], v)
		}
	}
	if cm, ok := c.s.(dedupe.Committer); ok {
		cm.Committed(keys, vs)
	}
	return nil
}

// claimN claims n new keys (rounded up to whole batches) and returns how
// long it took.
func (c *claimer) claimN(ctx context.Context, pool *pgxpool.Pool, n int) (time.Duration, error) {
	begin := time.Now()
	for done := 0; done < n; done += c.batch {
		if err := c.claimBatch(ctx, pool); err != nil {
			return 0, err
		}
	}
	return time.Since(begin), nil
}

// event is one committed batch of the claim loop.
type event struct {
	end  time.Time
	took time.Duration
	keys int
}

// loop claims batches until stop is closed and returns every batch's
// completion on done.
func (c *claimer) loop(ctx context.Context, pool *pgxpool.Pool, stop <-chan struct{}, done chan<- loopResult) {
	var out loopResult
	for {
		select {
		case <-stop:
			done <- out
			return
		default:
		}
		begin := time.Now()
		if err := c.claimBatch(ctx, pool); err != nil {
			out.err = err
			done <- out
			return
		}
		now := time.Now()
		out.events = append(out.events, event{end: now, took: now.Sub(begin), keys: c.batch})
	}
}

type loopResult struct {
	events []event
	err    error
}

// window sums the keys of the batches that ended in (from, to] and
// returns their rate and the longest of those batches.
func (l loopResult) window(from, to time.Time) (rate float64, worst time.Duration, batches int) {
	keys := 0
	for _, e := range l.events {
		if e.end.After(from) && !e.end.After(to) {
			keys += e.keys
			batches++
			worst = max(worst, e.took)
		}
	}
	return float64(keys) / to.Sub(from).Seconds(), worst, batches
}
