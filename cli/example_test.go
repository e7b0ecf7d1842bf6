package cli_test

import (
	"context"
	"fmt"
	"os"

	"github.com/effectively-once/effectively/cli"
	"github.com/effectively-once/effectively/consumer"
	"github.com/jackc/pgx/v5"
)

// A team's own operations binary: the whole command tree, with the team's
// handler registered so that "parked redrive --handler ledger" can run it.
func ExampleNewRoot() {
	apply := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO ledger (transfer_id, payload) VALUES ($1, $2)
ON CONFLICT (transfer_id) DO NOTHING`, m.ID, m.Value)
		return err
	}
	root := cli.NewRoot(cli.Options{
		Name:     "ledger-ops",
		Handlers: map[string]consumer.Handler{"ledger": apply},
	})
	root.SetArgs(os.Args[1:])
	if err := root.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "ledger-ops:", err)
		os.Exit(1)
	}
}
