// Command effectively operates the PostgreSQL side of effectively-once
// consumers: migrations, stats, parked messages, Kafka replays and the
// retention sweep. Run "effectively --help". It connects to Kafka
// clusters that take TLS (a private CA, mutual TLS) and SASL PLAIN or
// SCRAM; see "effectively replay --help".
//
// This stock binary has no handlers registered, so "parked redrive" needs
// a binary of your own that embeds package cli with your handlers.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/effectively-once/effectively/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.NewRoot(cli.Options{Version: version()}).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "effectively:", err)
		os.Exit(1)
	}
}

// version is the version of the module the binary was built from: the
// tag's for go install ...@v0.1.0, "(devel)" or a pseudo-version for a
// build from a checkout.
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
