// Package cli is the effectively command tree (cobra): migrate, stats,
// parked list|show|redrive|purge, replay and sweep. The stock binary,
// cmd/effectively, has no handlers; a team embeds the tree in its own
// binary with its handlers registered by name, so that "parked redrive"
// can run them:
//
//	root := cli.NewRoot(cli.Options{
//		Name:     "ledger-ops",
//		Handlers: map[string]consumer.Handler{"ledger": applyTransfer},
//	})
//	if err := root.ExecuteContext(ctx); err != nil {
//		fmt.Fprintln(os.Stderr, "ledger-ops:", err)
//		os.Exit(1)
//	}
//
// Every command that writes asks for confirmation unless --yes is given,
// and refuses to run without --yes when its input is not a terminal.
package cli
