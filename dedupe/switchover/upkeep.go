package switchover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
)

// pair is the upkeep both wrappers share: the tables, maintenance and
// warm-up of two strategies, each asked only for what it implements.
type pair struct {
	first, second dedupe.Strategy
	role          [2]string // "old"/"new" or "live"/"shadow", for messages
	log           *slog.Logger
}

func (p pair) parts() [2]dedupe.Strategy { return [2]dedupe.Strategy{p.first, p.second} }

// Migrations returns the migration lines of both strategies (dedupe.Migrator).
func (p pair) Migrations() []pg.Line {
	var out []pg.Line
	for _, s := range p.parts() {
		if m, ok := s.(dedupe.Migrator); ok {
			out = append(out, m.Migrations()...)
		}
	}
	return out
}

// Maintain runs the Maintain of each strategy that is a dedupe.Maintainer.
func (p pair) Maintain(ctx context.Context, db pg.DB) error {
	var errs []error
	for i, s := range p.parts() {
		if m, ok := s.(dedupe.Maintainer); ok {
			if err := m.Maintain(ctx, db); err != nil {
				errs = append(errs, fmt.Errorf("%s strategy %s: %w", p.role[i], s.Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// RunMaintenance runs the RunMaintenance of each strategy that is a
// dedupe.Maintainer, side by side, until both return. One that stops with
// an error is logged at once, while the other keeps running: stopping the
// other would leave it without upkeep too (a bloom strategy without new
// partitions fails its claims).
func (p pair) RunMaintenance(ctx context.Context, db pg.DB) error {
	return p.both(ctx, func(ctx context.Context, s dedupe.Strategy) (bool, error) {
		m, ok := s.(dedupe.Maintainer)
		if !ok {
			return false, nil
		}
		return true, m.RunMaintenance(ctx, db)
	}, "maintenance stopped; the other strategy's keeps running")
}

// Warm runs the Warm of each strategy that is a dedupe.Warmer, side by side.
func (p pair) Warm(ctx context.Context, db pg.DB) error {
	return p.both(ctx, func(ctx context.Context, s dedupe.Strategy) (bool, error) {
		w, ok := s.(dedupe.Warmer)
		if !ok {
			return false, nil
		}
		return true, w.Warm(ctx, db)
	}, "warm-up failed; it keeps answering by probing its store")
}

func (p pair) both(ctx context.Context, f func(context.Context, dedupe.Strategy) (bool, error), what string) error {
	var (
		wg   sync.WaitGroup
		errs [2]error
	)
	for i, s := range p.parts() {
		wg.Go(func() {
			ran, err := f(ctx, s)
			if !ran || err == nil {
				return
			}
			errs[i] = fmt.Errorf("%s strategy %s: %w", p.role[i], s.Name(), err)
			if ctx.Err() == nil {
				p.log.Error("switchover: "+p.role[i]+" strategy "+what, "strategy", s.Name(), "err", err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs[0], errs[1])
}

// savepoint runs f under the savepoint name of tx, then rolls it back
// (keep false) or releases it (keep true). When f fails the savepoint is
// rolled back whatever keep says, and f's error returned. An error of the
// savepoint commands themselves is returned wrapped in errTx: the
// transaction is then unusable.
func savepoint(ctx context.Context, tx pgx.Tx, name string, keep bool, f func() error) error {
	if _, err := tx.Exec(ctx, "SAVEPOINT "+name); err != nil {
		return &txError{err}
	}
	ferr := f()
	end := "RELEASE SAVEPOINT " + name
	if ferr != nil || !keep {
		end = "ROLLBACK TO SAVEPOINT " + name + "; " + end
	}
	if _, err := tx.Exec(ctx, end); err != nil {
		return &txError{errors.Join(ferr, err)}
	}
	return ferr
}

// txError is a failure of the transaction itself, not of a strategy's
// claim: nothing more can run in it.
type txError struct{ err error }

func (e *txError) Error() string { return "savepoint: " + e.err.Error() }
func (e *txError) Unwrap() error { return e.err }
