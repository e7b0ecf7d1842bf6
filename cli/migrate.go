package cli

import (
	"fmt"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/idempotency"
	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/pg"
	"github.com/spf13/cobra"
)

func (a *app) migrateCmd() *cobra.Command {
	var print, withKafka, withOutbox, withIdempotency, noParked, noStrategy bool
	of := &outboxFlags{}
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade the library's tables",
		Long: `Create or upgrade the tables a consumer needs: the parked-messages table,
the markers table(s) of the strategy named by --strategy, with --kafka the
Kafka offsets table, with --outbox the outbox's tables (--outbox-table), and
with --idempotency the Idempotency-Key middleware's responses table
(effectively.idempotency_responses, whose rows are its keys' claims; the
markers of a Config.Strategy are the strategy's).
Run it once per strategy a deployment uses.

Migrations already applied (recorded in <schema>.schema_migrations) are
skipped, and an advisory lock keeps concurrent runs apart, so it is safe
while consumers run.

With --print it writes the SQL script instead of applying it, for a DBA to
review and run by hand (psql -f); the script records its versions, so a later
migrate applies nothing. In code the same is pg.Migrate (and
pg.MigrationSQL) over a consumer's Migrations, which Consumer.Migrate runs.`,
		Example: `  effectively migrate --strategy idset --kafka
  effectively migrate --strategy highwater --print > migrate.sql`,
		Args: cobra.NoArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			lines, err := a.migrationLines(!noParked, !noStrategy, withKafka)
			if err != nil {
				return err
			}
			if withOutbox {
				o, err := a.outbox(of)
				if err != nil {
					return err
				}
				lines = append(lines, o.Line())
			}
			if withIdempotency {
				lines = append(lines, idempotency.ResponsesLine(a.schema, idempotency.DefaultTable))
			}
			if len(lines) == 0 {
				return fmt.Errorf("nothing selected: drop --no-parked or --no-strategy, or add --kafka, --outbox or --idempotency")
			}
			if print {
				sql, err := pg.MigrationSQL(a.schema, lines...)
				if err != nil {
					return err
				}
				_, err = fmt.Fprint(cmd.OutOrStdout(), sql)
				return err
			}
			ctx := cmd.Context()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			pending, err := pg.PendingMigrations(ctx, pool, a.schema, lines...)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(pending) == 0 {
				fmt.Fprintln(out, "up to date: no migration to apply")
				return nil
			}
			fmt.Fprintf(out, "to apply in schema %s:\n", a.schema)
			for _, m := range pending {
				fmt.Fprintf(out, "  %s %03d_%s\n", m.Line, m.Version, m.Name)
			}
			if err := a.confirm(cmd, fmt.Sprintf("Apply %d migration(s)?", len(pending))); err != nil {
				return err
			}
			applied, err := pg.Migrate(ctx, pool, a.schema, lines...)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "applied %d migration(s)\n", len(applied))
			return nil
		}),
	}
	f := cmd.Flags()
	f.BoolVar(&print, "print", false, "print the SQL instead of applying it")
	f.BoolVar(&withKafka, "kafka", false, "include the Kafka offsets table (--offsets-table)")
	f.BoolVar(&withOutbox, "outbox", false, "include the outbox's tables (--outbox-table)")
	f.BoolVar(&withIdempotency, "idempotency", false, "include the Idempotency-Key middleware's responses table")
	f.StringVar(&of.table, "outbox-table", outbox.DefaultTable, "name of the outbox's messages table, with --outbox")
	f.BoolVar(&noParked, "no-parked", false, "leave out the parked-messages table")
	f.BoolVar(&noStrategy, "no-strategy", false, "leave out the strategy's tables")
	return cmd
}

// migrationLines returns the selected migration lines.
func (a *app) migrationLines(withParked, strategy, withKafka bool) ([]pg.Line, error) {
	var lines []pg.Line
	if withParked {
		lines = append(lines, parked.Line(a.schema, a.parkedTable))
	}
	if strategy {
		s, err := a.strategy()
		if err != nil {
			return nil, err
		}
		if m, ok := s.(dedupe.Migrator); ok {
			lines = append(lines, m.Migrations()...)
		}
	}
	if withKafka {
		lines = append(lines, a.offsets().Line())
	}
	return lines, nil
}
