package cli

import (
	"context"
	"fmt"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/idset"
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
--retention. Highwater marks do not expire.

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
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			switch st := s.(type) {
			case *idset.Strategy:
				mk, _ := markersOf(st)
				pool, err := a.db(ctx)
				if err != nil {
					return err
				}
				var n int64
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+mk.ident()+` WHERE processed_at < now() - $1::bigint * interval '1 microsecond'`,
					st.Retention().Microseconds()).Scan(&n); err != nil {
					return fmt.Errorf("markers: %w", err)
				}
				if n == 0 {
					fmt.Fprintf(out, "no marker in %s.%s is older than %s\n", mk.schema, mk.table, st.Retention())
					return nil
				}
				if err := a.confirm(cmd, fmt.Sprintf("Delete about %d marker(s) older than %s from %s.%s?", n, st.Retention(), mk.schema, mk.table)); err != nil {
					return err
				}
				deleted, err := st.Sweep(ctx, pool)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "deleted %d expired marker(s) from %s.%s\n", deleted, mk.schema, mk.table)
				return nil
			case *bloom.Strategy:
				mk, _ := markersOf(st)
				pool, err := a.db(ctx)
				if err != nil {
					return err
				}
				if err := a.confirm(cmd, fmt.Sprintf("Drop the partitions of %s.%s older than %s?", mk.schema, mk.table, st.Retention())); err != nil {
					return err
				}
				before, err := partitionCount(ctx, pool, mk)
				if err != nil {
					return err
				}
				if err := st.Maintain(ctx, pool); err != nil {
					return err
				}
				after, err := partitionCount(ctx, pool, mk)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "maintenance of %s.%s done: %d partition(s) before, %d after\n", mk.schema, mk.table, before, after)
				return nil
			}
			return fmt.Errorf("strategy %q has no retention sweep (highwater marks do not expire)", s.Name())
		}),
	}
	return cmd
}

func partitionCount(ctx context.Context, pool *pgxpool.Pool, mk markers) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_partition_tree(to_regclass($1)) WHERE isleaf`, mk.ident()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("partitions of %s: %w", mk.ident(), err)
	}
	return n, nil
}

// prepare readies a strategy for claims: a bloom strategy needs its
// partitions to exist.
func prepare(ctx context.Context, pool *pgxpool.Pool, s dedupe.Strategy) error {
	if b, ok := s.(*bloom.Strategy); ok {
		return b.Maintain(ctx, pool)
	}
	return nil
}
