package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
)

// Classification is what the consumer's path makes of one message up to
// its handler.
type Classification struct {
	// Key is the message's dedupe key, as the consumer derives it.
	Key dedupe.Key
	// Err is why the message has no usable key (the KeyFunc failed, the key
	// is invalid, or the strategy refused it): the consumer parks it with
	// reason invalid_key.
	Err error
	// Verdict is the strategy's claim; zero when Err is set.
	Verdict dedupe.Verdict
	// Outcome is what the consumer would report for the message:
	// OutcomeApplied for a new one (its handler runs), OutcomeDuplicate,
	// OutcomeMismatch, OutcomeParked (no usable key, or a mismatch under
	// MismatchPark) or OutcomeRetried (a sequence gap).
	Outcome Outcome
}

// Classify runs msgs through the consumer's own path, as one batch, up to
// the handler: each key is derived as the consumer derives it (cfg's
// KeyFunc, Scope, NoFingerprint, MaxKeyLen and the strategy's key rules),
// and the strategy claims the usable ones in tx. The claim writes markers:
// roll tx back to leave nothing behind, as the replay dry run does. cfg
// needs no handler. Messages are classified as if delivered for the first
// time: a sequenced strategy's earlier messages still awaiting a retry in
// a running consumer are not known here.
func Classify(ctx context.Context, tx pgx.Tx, cfg Config, msgs []*Message) ([]Classification, error) {
	if cfg.handlers() == 0 {
		cfg.Handler = func(context.Context, pgx.Tx, *Message) error { return errors.New("classify runs no handler") }
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	p := newPath(cfg, cfg.Logger, nil)
	items := make([]*item, len(msgs))
	for i, m := range msgs {
		items[i] = &item{m: m}
		items[i].key, items[i].keyErr = p.keys.key(m)
	}
	for {
		var run []*item
		for _, it := range items {
			it.reset()
			if it.keyErr != nil {
				it.park(parked.ReasonInvalidKey, it.keyErr, false)
			} else {
				run = append(run, it)
			}
		}
		if _, err := tx.Exec(ctx, "SAVEPOINT effectively_classify"); err != nil {
			return nil, fmt.Errorf("savepoint: %w", err)
		}
		news, err := p.claim(ctx, tx, run, &BatchStats{})
		var ke *dedupe.KeyError
		if errors.As(err, &ke) && markInvalid(items, ke) {
			// As in a batch: the message whose key the strategy refused is
			// parked, and the others are claimed again without it.
			if err := rollbackTo(ctx, tx, "effectively_classify"); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT effectively_classify"); err != nil {
			return nil, fmt.Errorf("release savepoint: %w", err)
		}
		for _, it := range news {
			it.outcome = OutcomeApplied
		}
		break
	}
	out := make([]Classification, len(items))
	for i, it := range items {
		out[i] = Classification{Key: it.key, Err: it.keyErr, Verdict: it.verdict, Outcome: it.outcome}
	}
	return out, nil
}
