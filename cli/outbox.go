package cli

import (
	"context"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/effectively-once/effectively/outbox"
	"github.com/effectively-once/effectively/pg"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// OutboxStats is what "outbox stats --json" prints.
type OutboxStats struct {
	Table  string            `json:"table"`
	Sinks  []OutboxSinkStats `json:"sinks"`
	Leases OutboxLeaseStats  `json:"leases"`
	// Slots are the log relays' replication slots, with the problems
	// "outbox health" would report at its defaults.
	Slots []OutboxSlot `json:"slots"`
	// Log counts the log table's rows (LogMode emits).
	Log OutboxLogStats `json:"log"`
}

// OutboxLogStats counts the log table's rows, published or not, until a
// log relay's cleanup empties them.
type OutboxLogStats struct {
	Rows             int64   `json:"rows"`
	Messages         int64   `json:"messages"`
	OldestRowSeconds float64 `json:"oldest_row_seconds"`
}

// OutboxSinkStats is one sink's rows.
type OutboxSinkStats struct {
	Sink    string `json:"sink"`
	Waiting int64  `json:"waiting"`
	// OldestWaitingSeconds is the oldest waiting row's age; 0 when nothing
	// waits.
	OldestWaitingSeconds float64 `json:"oldest_waiting_seconds"`
	Parked               int64   `json:"parked"`
	// Published counts published rows the cleanup has not deleted yet.
	Published int64 `json:"published"`
}

// OutboxLeaseStats describes the partition leases.
type OutboxLeaseStats struct {
	Partitions  int `json:"partitions"`
	Held        int `json:"held"`
	Relays      int `json:"relays"`
	Expired     int `json:"expired"`
	RelaysAlive int `json:"relays_alive"`
}

// OutboxMessage is one outbox row as "outbox list --json" prints it. Key
// and Value are base64 when they are not valid text (KeyBase64,
// ValueBase64 say so); KeyNull and ValueNull tell nil from empty.
type OutboxMessage struct {
	ID            int64          `json:"id"`
	Sink          string         `json:"sink"`
	MessageID     string         `json:"message_id"`
	Seq           int64          `json:"seq"`
	Key           string         `json:"key,omitempty"`
	KeyBase64     bool           `json:"key_base64,omitempty"`
	KeyNull       bool           `json:"key_null,omitempty"`
	Value         string         `json:"value"`
	ValueBase64   bool           `json:"value_base64,omitempty"`
	ValueNull     bool           `json:"value_null,omitempty"`
	Headers       []OutboxHeader `json:"headers"`
	CreatedAt     time.Time      `json:"created_at"`
	Attempts      int            `json:"attempts"`
	LastError     string         `json:"last_error,omitempty"`
	NextAttemptAt *time.Time     `json:"next_attempt_at,omitempty"`
	ParkedAt      *time.Time     `json:"parked_at,omitempty"`
	Reason        string         `json:"reason,omitempty"`
}

// OutboxHeader is one header of an OutboxMessage.
type OutboxHeader struct {
	Key         string `json:"key"`
	Value       string `json:"value"`
	ValueBase64 bool   `json:"value_base64,omitempty"`
}

func outboxMessage(r outbox.Row) OutboxMessage {
	m := OutboxMessage{ID: r.ID, Sink: r.Message.Sink, MessageID: r.Message.ID, Seq: r.Seq, CreatedAt: r.CreatedAt,
		Attempts: r.Attempts, LastError: r.LastError, Reason: r.ParkReason, Headers: []OutboxHeader{}}
	m.Key, m.KeyBase64 = textOrBase64(r.Message.Key)
	m.KeyNull = r.Message.Key == nil
	m.Value, m.ValueBase64 = textOrBase64(r.Message.Value)
	m.ValueNull = r.Message.Value == nil
	for _, h := range r.Message.Headers {
		v, b64 := textOrBase64(h.Value)
		m.Headers = append(m.Headers, OutboxHeader{Key: h.Key, Value: v, ValueBase64: b64})
	}
	if !r.NextAttemptAt.IsZero() {
		t := r.NextAttemptAt
		m.NextAttemptAt = &t
	}
	if !r.ParkedAt.IsZero() {
		t := r.ParkedAt
		m.ParkedAt = &t
	}
	return m
}

// outboxFlags are the flags every outbox command shares.
type outboxFlags struct {
	table string
}

func (a *app) outboxCmd() *cobra.Command {
	of := &outboxFlags{}
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "Report the outbox, list, redrive and purge its parked messages",
		Long: `The outbox holds the messages emitted inside business transactions until a
relay publishes them. "outbox stats" reports what waits per sink, who holds
the partitions and the log relays' replication slots; "outbox health" checks
the slots and exits non-zero on a problem; a message a sink refused for good (too large, unknown topic or
queue) is parked and holds back the later messages of its key until it is
redriven ("outbox redrive") or purged ("outbox purge"). The tables are in
--schema, named after --outbox-table.`,
	}
	cmd.PersistentFlags().StringVar(&of.table, "outbox-table", outbox.DefaultTable,
		"name of the outbox's messages table (its other tables take it as a prefix)")
	cmd.AddCommand(a.outboxStatsCmd(of), a.outboxHealthCmd(of), a.outboxListCmd(of), a.outboxRedriveCmd(of), a.outboxPurgeCmd(of))
	return cmd
}

func (a *app) outbox(of *outboxFlags) (*outbox.Outbox, error) {
	o, err := outbox.New(outbox.Config{Schema: a.schema, Table: of.table})
	if err != nil {
		return nil, fmt.Errorf("--schema, --outbox-table: %w", err)
	}
	return o, nil
}

func (a *app) outboxStatsCmd(of *outboxFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Report rows waiting, parked and published per sink, and the partition leases",
		Long: `Report, per sink, the rows waiting for a relay (neither published nor parked)
and the oldest one's age, the parked rows, and the published rows the cleanup
has not deleted yet; how many of the partitions are leased, to how many
relays, and how many leases ran out without being released (a relay that
died or stalled: another takes them over); and the log relays' replication
slots, as "outbox health" checks them. It reads the whole messages table,
which the cleanup keeps small; it only reads.`,
		Example: `  effectively outbox stats
  effectively outbox stats --outbox-table orders_outbox --json`,
		Args: cobra.NoArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			o, err := a.outbox(of)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			st, err := o.Stats(ctx, pool)
			if err != nil {
				return err
			}
			l := st.Leases
			rep := OutboxStats{Table: a.outboxIdent(of), Sinks: []OutboxSinkStats{},
				Leases: OutboxLeaseStats{Partitions: l.Partitions, Held: l.Held, Relays: l.Relays, Expired: l.Expired, RelaysAlive: l.RelaysAlive}}
			rep.Log = OutboxLogStats{Rows: st.Log.Rows, Messages: st.Log.Messages, OldestRowSeconds: st.Log.OldestAge.Seconds()}
			for _, s := range st.Sinks {
				rep.Sinks = append(rep.Sinks, OutboxSinkStats{Sink: s.Sink, Waiting: s.Waiting,
					OldestWaitingSeconds: s.OldestWaitingAge.Seconds(), Parked: s.Parked, Published: s.Published})
			}
			slots, err := o.Slots(ctx, pool)
			if err != nil {
				return err
			}
			rep.Slots = []OutboxSlot{}
			for _, s := range slots {
				rep.Slots = append(rep.Slots, outboxSlot(s, outbox.SlotProblems{MaxLagBytes: DefaultMaxSlotLagBytes, MaxConfirmLag: DefaultMaxConfirmLag}))
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			out := cmd.OutOrStdout()
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SINK\tWAITING\tOLDEST WAITING\tPARKED\tPUBLISHED")
			for _, s := range st.Sinks {
				age := "-"
				if s.Waiting > 0 {
					age = s.OldestWaitingAge.Round(time.Millisecond).String()
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\n", showRef(s.Sink), s.Waiting, age, s.Parked, s.Published)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(out, "\nleases: %d of %d partitions held by %d relay(s), %d expired; %d relay(s) alive\n",
				l.Held, l.Partitions, l.Relays, l.Expired, l.RelaysAlive)
			if st.Log.Rows > 0 {
				fmt.Fprintf(out, "\nlog table (LogMode emits, kept published or not until a log relay's cleanup empties them): %d messages in %d rows, the oldest %s old\n",
					st.Log.Messages, st.Log.Rows, st.Log.OldestAge.Round(time.Millisecond))
			}
			if len(rep.Slots) > 0 {
				fmt.Fprintln(out, "\nlog relay slots (a log relay marks nothing published: WAITING counts its TableMode rows until the cleanup deletes them):")
				printSlots(out, rep.Slots)
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (a *app) outboxIdent(of *outboxFlags) string {
	return fmt.Sprintf("%s.%s", showRef(a.schema), showRef(of.table))
}

func (a *app) outboxListCmd(of *outboxFlags) *cobra.Command {
	var (
		f      outbox.RowFilter
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the outbox's parked messages (or, with --waiting, the waiting ones), oldest first",
		Long: `List the outbox's parked messages, oldest first: the messages a sink refused
for good, with the reason. Each holds back the later messages of its sink and
key until it is redriven or purged. With --waiting, list instead the messages
waiting for a relay, with their attempts and last transient error.`,
		Example: `  effectively outbox list
  effectively outbox list --sink orders --json --limit 0
  effectively outbox list --waiting --limit 20`,
		Args: cobra.NoArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			if f.Limit < 0 {
				return errors.New("--limit must not be negative")
			}
			o, err := a.outbox(of)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			rows, err := o.Rows(ctx, pool, f)
			if err != nil {
				return err
			}
			ms := make([]OutboxMessage, len(rows))
			for i, r := range rows {
				ms[i] = outboxMessage(r)
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), ms)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			if f.Waiting {
				fmt.Fprintln(tw, "ID\tSINK\tKEY\tSEQ\tMESSAGE ID\tCREATED AT\tATTEMPTS\tNEXT ATTEMPT\tLAST ERROR")
			} else {
				fmt.Fprintln(tw, "ID\tSINK\tKEY\tSEQ\tMESSAGE ID\tPARKED AT\tATTEMPTS\tREASON")
			}
			for _, r := range rows {
				key := "(null)"
				if r.Message.Key != nil {
					key = showRef(string(r.Message.Key))
				}
				if f.Waiting {
					next := "-"
					if !r.NextAttemptAt.IsZero() {
						next = r.NextAttemptAt.UTC().Format(time.RFC3339)
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\n", r.ID, showRef(r.Message.Sink), shorten(key, 40), r.Seq,
						r.Message.ID, r.CreatedAt.UTC().Format(time.RFC3339), r.Attempts, next, orDash(shorten(r.LastError, 60)))
				} else {
					fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%d\t%s\n", r.ID, showRef(r.Message.Sink), shorten(key, 40), r.Seq,
						r.Message.ID, r.ParkedAt.UTC().Format(time.RFC3339), r.Attempts, shorten(r.ParkReason, 60))
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if f.Limit > 0 && len(rows) == f.Limit {
				fmt.Fprintf(cmd.ErrOrStderr(), "(showing the first %d; --limit 0 shows all)\n", f.Limit)
			}
			return nil
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&f.Sink, "sink", "", "only messages to this sink")
	fs.BoolVar(&f.Waiting, "waiting", false, "list the messages waiting for a relay instead of the parked ones")
	fs.IntVar(&f.Limit, "limit", 100, "at most this many messages (0: no limit)")
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// outboxSelection selects parked outbox rows for redrive and purge.
type outboxSelection struct {
	ids  []int64
	sink string
	all  bool
}

func (s *outboxSelection) flags(fs *pflag.FlagSet, verb string) {
	fs.Int64SliceVar(&s.ids, "id", nil, "these parked rows, by the ID \"outbox list\" shows (repeat or comma-separate)")
	fs.StringVar(&s.sink, "sink", "", "every parked message of this sink")
	fs.BoolVar(&s.all, "all", false, verb+" every parked message of every sink")
}

// parked returns the parked rows selected, refusing an empty selection and
// IDs that are not parked.
func (s *outboxSelection) parked(ctx context.Context, o *outbox.Outbox, a *app, of *outboxFlags) ([]int64, error) {
	if len(s.ids) == 0 && s.sink == "" && !s.all {
		return nil, errors.New("no selection: give --id or --sink, or --all for every parked message")
	}
	if s.all && (len(s.ids) > 0 || s.sink != "") {
		return nil, errors.New("--all selects every parked message: give it without --id and --sink")
	}
	pool, err := a.db(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := o.Rows(ctx, pool, outbox.RowFilter{Sink: s.sink, IDs: s.ids})
	if err != nil {
		return nil, err
	}
	found := map[int64]bool{}
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
		found[r.ID] = true
	}
	for _, id := range s.ids {
		if !found[id] {
			if s.sink != "" {
				return nil, fmt.Errorf("no parked message with id %d of sink %s in %s", id, showRef(s.sink), a.outboxIdent(of))
			}
			return nil, fmt.Errorf("no parked message with id %d in %s", id, a.outboxIdent(of))
		}
	}
	return ids, nil
}

func (a *app) outboxRedriveCmd(of *outboxFlags) *cobra.Command {
	var s outboxSelection
	cmd := &cobra.Command{
		Use:   "redrive",
		Short: "Put parked outbox messages back in line for the relays",
		Long: `Put the selected parked messages back in line, and wake the relays: they
publish them, and then the later messages of their keys. Fix what the sink
refused first (create the topic or queue, raise its size limit), or the
message parks again. It is safe while relays run.`,
		Example: `  effectively outbox redrive --id 42
  effectively outbox redrive --sink orders --yes`,
		Args: cobra.NoArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			return a.outboxWrite(cmd, of, &s, "Redrive %d parked outbox message(s)?", "redrove %d parked outbox message(s)\n",
				(*outbox.Outbox).Redrive)
		}),
	}
	s.flags(cmd.Flags(), "redrive")
	return cmd
}

func (a *app) outboxPurgeCmd(of *outboxFlags) *cobra.Command {
	var s outboxSelection
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete parked outbox messages for good",
		Long: `Delete the selected parked messages for good: they are never published, and
the later messages of their keys are released to the relays. It is safe while
relays run.`,
		Example: `  effectively outbox purge --id 42
  effectively outbox purge --sink orders --yes`,
		Args: cobra.NoArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			return a.outboxWrite(cmd, of, &s, "Delete %d parked outbox message(s) for good?", "purged %d parked outbox message(s)\n",
				(*outbox.Outbox).Purge)
		}),
	}
	s.flags(cmd.Flags(), "purge")
	return cmd
}

// outboxWrite selects the parked rows, confirms, and applies do to them:
// exactly the rows counted in the question, so a message parked meanwhile
// is left alone.
func (a *app) outboxWrite(cmd *cobra.Command, of *outboxFlags, s *outboxSelection, question, done string,
	do func(*outbox.Outbox, context.Context, pg.DB, ...int64) (int64, error)) error {
	o, err := a.outbox(of)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	ids, err := s.parked(ctx, o, a, of)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if len(ids) == 0 {
		fmt.Fprintln(out, "no parked outbox message matches")
		return nil
	}
	if err := a.confirm(cmd, fmt.Sprintf(question, len(ids))); err != nil {
		return err
	}
	pool, err := a.db(ctx)
	if err != nil {
		return err
	}
	n, err := do(o, ctx, pool, ids...)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, done, n)
	return nil
}
