package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
)

// claim is the stage after admit: the strategy claims the keys of items in
// tx, in one call, and every item that is not new is settled by its
// verdict. It returns the new ones, in order, for the handler. A key the
// strategy refuses comes back as a *dedupe.KeyError.
func (p *path) claim(ctx context.Context, tx pgx.Tx, items []*item, st *BatchStats) ([]*item, error) {
	if len(items) == 0 {
		return nil, nil
	}
	keys := make([]dedupe.Key, len(items))
	for i, it := range items {
		keys[i] = it.key
	}
	t := time.Now()
	verdicts, err := p.claimKeys(ctx, tx, keys)
	st.Claim += time.Since(t)
	if err != nil {
		return nil, err
	}
	news := items[:0:0]
	for i, it := range items {
		it.verdict = verdicts[i]
		if p.settleVerdict(it) {
			news = append(news, it)
		}
	}
	return news, nil
}

// claimKeys asks the strategy for the verdicts of keys and checks its answer.
func (p *path) claimKeys(ctx context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	s := p.cfg.Strategy
	verdicts, err := s.Claim(ctx, tx, keys)
	if err != nil {
		var ke *dedupe.KeyError
		if errors.As(err, &ke) {
			return nil, ke
		}
		return nil, fmt.Errorf("claim (%s): %w", s.Name(), err)
	}
	if len(verdicts) != len(keys) {
		return nil, fmt.Errorf("claim (%s): %d verdicts for %d keys", s.Name(), len(verdicts), len(keys))
	}
	for i, v := range verdicts {
		if v < dedupe.VerdictNew || v > dedupe.VerdictMismatch {
			return nil, fmt.Errorf("claim (%s): invalid verdict %d for key %s", s.Name(), v, keys[i])
		}
	}
	return verdicts, nil
}

// settleVerdict gives it the outcome its verdict decides, and reports true
// for a new message, whose outcome its handler decides.
func (p *path) settleVerdict(it *item) bool {
	switch it.verdict {
	case dedupe.VerdictNew:
		return true
	case dedupe.VerdictDuplicate:
		it.outcome = OutcomeDuplicate
	case dedupe.VerdictMismatch:
		if p.cfg.OnMismatch == MismatchPark {
			it.park(parked.ReasonMismatch, fmt.Errorf("key %s was processed before with another payload", it.key), true)
		} else {
			it.outcome = OutcomeMismatch
		}
	case dedupe.VerdictGap:
		// The strategy keeps the order itself: the message is ahead of its
		// sender's mark and waits for the sequence numbers before it.
		p.wait(it, "an earlier sequence number has not arrived")
	}
	return false
}
