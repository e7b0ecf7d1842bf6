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
//
// The database URL comes from --database-url, --database-url-file,
// $EFFECTIVELY_DATABASE_URL or $DATABASE_URL, the first that is set; a
// password is better kept off the command line, in the file, the
// environment, $PGPASSWORD or ~/.pgpass.
//
// The commands that talk to Kafka (replay, stats) connect with TLS (--tls,
// --tls-ca, --tls-cert, --tls-key, --tls-server-name) and SASL PLAIN or
// SCRAM (--sasl-mechanism, --sasl-username); the password comes from
// $EFFECTIVELY_KAFKA_SASL_PASSWORD or --sasl-password-file, never from the
// command line. Each connection flag --NAME defaults to
// $EFFECTIVELY_KAFKA_NAME ("effectively replay --help" lists them).
package cli
