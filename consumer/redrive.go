package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
)

// Redrive runs the parked messages of cfg.Scope selected by f (whose Scope
// is empty or cfg.Scope; the zero Filter selects all of them) through cfg's
// handler again, oldest first, each in a transaction of its own that also
// deletes its parked row: a redriven message is applied exactly once and
// leaves the parked table in the same commit. cfg is the consumer's Config
// (its Name, Scope, Strategy, handler, KeyFunc, key settings, Schema,
// ParkedTable and Logger apply), so a message is keyed, claimed and
// handled on the same path as in the consumer. The result lists what
// became of every row (parked.RedriveResult).
//
// The row is deleted first, which locks it: a second Redrive of the same
// row, at the same time, waits and then finds it gone
// (parked.RedriveGone). A message parked without a dedupe marker (invalid_key, gap) has its key
// claimed with cfg.Strategy first (a message parked with reason
// invalid_key gets its key from cfg.KeyFunc, which can be a new one); if
// another delivery applied it meanwhile, its row is removed as a
// duplicate. A handler failure rolls the transaction back: the row stays
// parked, with attempts incremented and last_error set, and Redrive goes
// on with the next row. Each redriven row is logged at Info level.
//
// Redrive is safe while consumers of the same scope run. It returns an
// error only when it cannot go on (the database is unreachable, the table
// missing, ctx done), together with what it did until then.
func Redrive(ctx context.Context, db pg.DB, cfg Config, f parked.Filter) (parked.RedriveResult, error) {
	var res parked.RedriveResult
	if db == nil {
		return res, &ConfigError{Package: "consumer", Field: "db", Reason: "must not be nil"}
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return res, err
	}
	return redrive(ctx, db, newPath(cfg, cfg.Logger, nil), f)
}

// Redrive runs the consumer's parked messages selected by f through its
// handler again; see the function Redrive.
func (c *Consumer) Redrive(ctx context.Context, f parked.Filter) (parked.RedriveResult, error) {
	return redrive(ctx, c.db, c.path, f)
}

func redrive(ctx context.Context, db pg.DB, p path, f parked.Filter) (parked.RedriveResult, error) {
	var res parked.RedriveResult
	switch {
	case f.Limit < 0:
		return res, pg.ConfigErrorf("consumer", "Filter.Limit", "must not be negative, got %d", f.Limit)
	case f.OlderThan < 0:
		return res, pg.ConfigErrorf("consumer", "Filter.OlderThan", "must not be negative, got %s", f.OlderThan)
	case f.Scope != "" && f.Scope != p.cfg.Scope:
		return res, pg.ConfigErrorf("consumer", "Filter.Scope", "is %q, but a redrive runs the messages of its Config's scope, %q: leave it empty, or redrive with that scope's Config", f.Scope, p.cfg.Scope)
	}
	f.Scope = p.cfg.Scope
	r := &redriver{path: p, store: parked.NewStore(db, p.cfg.Schema, p.cfg.ParkedTable), db: db}
	ids, err := r.store.IDs(ctx, f)
	if err != nil {
		return res, fmt.Errorf("consumer: redrive: %w", err)
	}
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		it, err := r.one(ctx, id)
		if err != nil {
			return res, err
		}
		p.log.InfoContext(ctx, "redrive", "id", it.ID, "ref", it.Ref, "park_count", it.ParkCount, "reason", it.Reason, "outcome", it.Outcome, "err", errString(it.Err))
		res.Add(it)
	}
	return res, nil
}

type redriver struct {
	path  path
	store *parked.Store
	db    pg.DB
}

// one redrives the row id in a transaction of its own, on the consumer's
// path: the key (derived again if it was parked without one), the claim
// (if it was parked without a marker), the handler. The row is taken
// (deleted) in the same transaction, so that both commit or roll back
// together.
func (r *redriver) one(ctx context.Context, id int64) (parked.RedriveItem, error) {
	p := &r.path
	it := parked.RedriveItem{ID: id}
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return it, fmt.Errorf("consumer: redrive: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	row, err := r.store.TakeTx(ctx, tx, p.cfg.Scope, id)
	if errors.Is(err, pgx.ErrNoRows) {
		it.Outcome = parked.RedriveGone
		return it, nil
	}
	if err != nil {
		return it, fmt.Errorf("consumer: redrive: %w", err)
	}
	m := parkedMessage(&row)
	it.Ref, it.Reason, it.ParkCount = row.Ref, row.Reason, row.ParkCount

	key, hasKey := row.DedupeKey()
	if !hasKey {
		k, kerr := p.keys.key(m)
		if kerr != nil {
			it.Outcome, it.Err = parked.RedriveSkipped, fmt.Errorf("the KeyFunc derives no usable key (redrive it with a KeyFunc that does): %w", kerr)
			return it, nil
		}
		key = k
		m.DedupeKey = k
	}
	var verdict dedupe.Verdict
	if !row.HasMarker {
		vs, cerr := p.claimKeys(ctx, tx, []dedupe.Key{key})
		var ke *dedupe.KeyError
		switch {
		case errors.As(cerr, &ke):
			it.Outcome, it.Err = parked.RedriveSkipped, ke
			return it, nil
		case cerr != nil:
			return it, fmt.Errorf("consumer: redrive: %w", cerr)
		}
		switch verdict = vs[0]; verdict {
		case dedupe.VerdictDuplicate:
			if err := tx.Commit(ctx); err != nil {
				return it, fmt.Errorf("consumer: redrive: commit: %w", err)
			}
			p.committed([]dedupe.Key{key}, vs)
			it.Outcome = parked.RedriveDuplicate
			return it, nil
		case dedupe.VerdictMismatch:
			it.Outcome, it.Err = parked.RedriveSkipped, fmt.Errorf("key %s was applied before with another payload", key)
			return it, nil
		case dedupe.VerdictGap:
			it.Outcome, it.Err = parked.RedriveSkipped, fmt.Errorf("sequence gap: %s is still ahead of its sender's mark", key)
			return it, nil
		}
	}
	if herr := p.handleOne(ctx, tx, m); herr != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		it.Outcome, it.Err = parked.RedriveFailed, herr
		if err := r.store.RecordFailure(ctx, id, "redrive: "+herr.Error()); err != nil {
			return it, fmt.Errorf("consumer: redrive: %w", err)
		}
		return it, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return it, fmt.Errorf("consumer: redrive: commit: %w", err)
	}
	if verdict != 0 {
		p.committed([]dedupe.Key{key}, []dedupe.Verdict{verdict})
	}
	it.Outcome = parked.RedriveApplied
	return it, nil
}
