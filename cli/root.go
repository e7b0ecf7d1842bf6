package cli

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/bloom"
	"github.com/effectively-once/effectively/dedupe/highwater"
	"github.com/effectively-once/effectively/dedupe/idset"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/spf13/cobra"
)

// Options configures the command tree. The zero value is the stock
// command: no handlers, the built-in strategies and key functions.
type Options struct {
	// Name is the command's name in help and errors. Defaults to "effectively".
	Name string
	// Version is printed by --version. Defaults to "" (no --version flag).
	Version string
	// Handlers are the handlers "parked redrive --handler NAME" can run, by
	// name. Defaults to none.
	Handlers map[string]consumer.Handler
	// BatchHandlers are batch handlers, by name, also usable with
	// --handler; each is called with one message at a time. Defaults to none.
	BatchHandlers map[string]consumer.BatchHandler
	// Strategies are configured strategies, by name, usable with
	// --strategy in addition to the built-in "idset", "highwater" and
	// "bloom" (which are configured from flags). A registered name hides
	// the built-in of the same name. The commands know a strategy only by
	// its interfaces: migrate applies its Migrations (dedupe.Migrator),
	// stats and sweep use dedupe.Inspector, and redrive runs
	// dedupe.Maintainer's Maintain first, so a strategy that implements
	// them works with every command. Defaults to none.
	Strategies map[string]dedupe.Strategy
	// KeyFuncs are key functions, by name, usable with --key in addition
	// to the built-in ones (see "effectively replay --help"). Defaults to none.
	KeyFuncs map[string]consumer.KeyFunc
	// AssumeTerminal makes commands that write ask for confirmation on
	// their input even when it is not a terminal (for tools that answer the
	// prompt themselves). Defaults to false: without a terminal, commands
	// that write refuse to run unless --yes is given.
	AssumeTerminal bool
	// KafkaTLS is the TLS configuration of the connections to Kafka when
	// no --tls* flag (or its environment variable) is given. Defaults to
	// nil: plaintext unless the flags ask for TLS.
	KafkaTLS *tls.Config
	// KafkaSASL authenticates the connections to Kafka when no
	// --sasl-mechanism (or its environment variable) is given: for
	// mechanisms the flags do not offer, such as kafka-go's
	// sasl/aws_msk_iam_v2. Defaults to nil: no SASL unless the flags ask
	// for it.
	KafkaSASL sasl.Mechanism
}

// app holds the options and the global flags of one command tree.
type app struct {
	opts Options

	dbURL        string
	dbURLFile    string
	schema       string
	parkedTable  string
	strategyName string
	markersTable string
	hwMode       string
	retention    time.Duration
	offsetsTable string
	yes          bool

	pool *pgxpool.Pool
	// errOut is the running command's stderr.
	errOut io.Writer
}

// NewRoot returns the command tree. Execute it with ExecuteContext; a team
// embeds it in its own binary to register its handlers:
//
//	root := cli.NewRoot(cli.Options{Handlers: map[string]consumer.Handler{"ledger": applyTransfer}})
//	if err := root.ExecuteContext(ctx); err != nil { os.Exit(1) }
func NewRoot(opts Options) *cobra.Command {
	if opts.Name == "" {
		opts.Name = "effectively"
	}
	a := &app{opts: opts}
	root := &cobra.Command{
		Use:   opts.Name,
		Short: "Operate effectively-once consumers: migrations, stats, parked messages, replays, retention",
		Long: opts.Name + ` operates the PostgreSQL side of effectively-once consumers: it applies the
migrations, reports markers, parked messages and Kafka lag, redrives parked
messages through a handler, moves a Kafka group's offsets back for a replay,
and sweeps expired markers.

Every command that writes asks for confirmation unless --yes is given, and
refuses to run without --yes when its input is not a terminal. Every command
is safe while consumers run, except where its help says otherwise
(replay requires the group's consumers to be stopped and checks it).

` + databaseHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	if opts.Version != "" {
		root.Version = opts.Version
	}
	f := root.PersistentFlags()
	f.StringVar(&a.dbURL, "database-url", "", "PostgreSQL URL (default $"+envDatabaseURL+", then $DATABASE_URL; with a password, prefer those or --database-url-file)")
	f.StringVar(&a.dbURLFile, "database-url-file", "", "file holding the PostgreSQL URL (a trailing newline is removed)")
	f.StringVar(&a.schema, "schema", pg.DefaultSchema, "schema of the library's tables")
	f.StringVar(&a.parkedTable, "parked-table", "parked", "name of the parked-messages table")
	f.StringVar(&a.strategyName, "strategy", "idset", "dedupe strategy: "+strings.Join(a.strategyNames(), ", "))
	f.StringVar(&a.markersTable, "markers-table", "", "markers table of a built-in strategy (default: the strategy's own: processed, marks, bloom_markers)")
	f.StringVar(&a.hwMode, "highwater-mode", "strict", "mode of the built-in highwater strategy: strict or monotonic")
	f.DurationVar(&a.retention, "retention", 0, "marker retention of the built-in idset and bloom strategies (default 168h)")
	f.StringVar(&a.offsetsTable, "offsets-table", "kafka_offsets", "name of the Kafka offsets table")
	f.BoolVarP(&a.yes, "yes", "y", false, "do not ask for confirmation before writing")

	root.AddCommand(a.migrateCmd(), a.statsCmd(), a.parkedCmd(), a.replayCmd(), a.sweepCmd(), a.outboxCmd())
	return root
}

// runE wraps a command's work so that its database connections are closed
// when it returns.
func (a *app) runE(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		a.errOut = cmd.ErrOrStderr()
		defer func() {
			if a.pool != nil {
				a.pool.Close()
				a.pool = nil
			}
		}()
		return a.explain(fn(cmd, args))
	}
}

func (a *app) parkedIdent() string {
	return parked.NewStore(nil, a.schema, a.parkedTable).Table()
}
func (a *app) offsets() *kafka.Offsets { return kafka.NewOffsets(a.schema, a.offsetsTable) }

func (a *app) strategyNames() []string {
	set := map[string]bool{"idset": true, "highwater": true, "bloom": true}
	for n := range a.opts.Strategies {
		set[n] = true
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// strategy returns the strategy named by --strategy.
func (a *app) strategy() (dedupe.Strategy, error) {
	if s, ok := a.opts.Strategies[a.strategyName]; ok {
		return s, nil
	}
	switch a.strategyName {
	case "idset":
		return idset.New(idset.Config{Schema: a.schema, Table: a.markersTable, Retention: a.retention})
	case "highwater":
		var mode highwater.Mode
		switch a.hwMode {
		case "strict":
			mode = highwater.Strict
		case "monotonic":
			mode = highwater.Monotonic
		default:
			return nil, fmt.Errorf("--highwater-mode: %q is neither strict nor monotonic", a.hwMode)
		}
		return highwater.New(highwater.Config{Schema: a.schema, Table: a.markersTable, Mode: mode})
	case "bloom":
		return bloom.New(bloom.Config{Schema: a.schema, Table: a.markersTable, Retention: a.retention})
	}
	return nil, fmt.Errorf("--strategy: unknown strategy %q; known: %s", a.strategyName, strings.Join(a.strategyNames(), ", "))
}

// confirm asks on the command's input, or refuses without a terminal.
func (a *app) confirm(cmd *cobra.Command, question string) error {
	if a.yes {
		return nil
	}
	in := cmd.InOrStdin()
	if !a.opts.AssumeTerminal && !isTerminal(in) {
		return errors.New("refusing to write without confirmation: the input is not a terminal; run again with --yes")
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "%s [y/N] ", question)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return errAborted
}

var errAborted = errors.New("aborted: nothing was written")

func isTerminal(v any) bool {
	f, ok := v.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
