package cli

import (
	"context"
	"errors"
	"fmt"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
)

func (a *app) sweepCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sweep",
		Short: "Delete expired markers once (the retention sweep)",
		Long: `Run the retention sweep of the strategy named by --strategy once and report
what it removed. For idset it deletes the markers older than --retention
(default 168h), in batches that each commit on their own and skip rows locked
by consumers, so it is safe while consumers run. For bloom it runs the
maintenance pass, which drops the partitions whose whole slice is older than
--retention. Highwater marks do not expire. Other strategies sweep as their
dedupe.Inspector implementation says.

The retention must be longer than the longest time after which a source can
deliver a message again, or a late redelivery is applied twice: use the same
--retention as the consumers.`,
		Example: `  effectively sweep --strategy idset --retention 336h --yes`,
		Args:    cobra.NoArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			s, err := a.strategy()
			if err != nil {
				return err
			}
			insp, ok := s.(dedupe.Inspector)
			if !ok {
				return fmt.Errorf("strategy %q has no retention sweep: it does not implement dedupe.Inspector", s.Name())
			}
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			plan, err := insp.SweepExpired(ctx, pool, true)
			if errors.Is(err, dedupe.ErrNoSweep) {
				return fmt.Errorf("strategy %q has no retention sweep: %w", s.Name(), err)
			}
			if err != nil {
				return err
			}
			if plan.Nothing {
				fmt.Fprintln(out, plan.Summary)
				return nil
			}
			if err := a.confirm(cmd, plan.Summary+"?"); err != nil {
				return err
			}
			res, err := insp.SweepExpired(ctx, pool, false)
			if err != nil {
				return err
			}
			fmt.Fprintln(out, res.Summary)
			return nil
		}),
	}
	return cmd
}

// prepare readies a strategy for claims: one that keeps up its storage (a
// bloom strategy's partitions) runs its maintenance once.
func prepare(ctx context.Context, pool *pgxpool.Pool, s dedupe.Strategy) error {
	if m, ok := s.(dedupe.Maintainer); ok {
		return m.Maintain(ctx, pool)
	}
	return nil
}
