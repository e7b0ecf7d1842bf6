package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
)

// StatsReport is what "stats --json" prints.
type StatsReport struct {
	Strategy     string `json:"strategy"`
	MarkersTable string `json:"markers_table,omitempty"`
	// Details are the strategy's own facts (mode, retention, partitions).
	Details      map[string]string `json:"details,omitempty"`
	Scopes       []ScopeStats      `json:"scopes"`
	Tables       []TableStats      `json:"tables"`
	KafkaOffsets []OffsetStats     `json:"kafka_offsets"`
}

// ScopeStats describes one scope.
type ScopeStats struct {
	Scope string `json:"scope"`
	// Markers counts the scope's markers (senders, for highwater).
	Markers      int64            `json:"markers"`
	OldestMarker *time.Time       `json:"oldest_marker,omitempty"`
	NewestMarker *time.Time       `json:"newest_marker,omitempty"`
	Parked       int64            `json:"parked"`
	ParkedBy     map[string]int64 `json:"parked_by_reason,omitempty"`
	OldestParked *time.Time       `json:"oldest_parked,omitempty"`
}

// TableStats is one table's size on disk, indexes and partitions included.
type TableStats struct {
	Table  string `json:"table"`
	Exists bool   `json:"exists"`
	Bytes  int64  `json:"bytes"`
}

// OffsetStats is one partition's offset stored in Postgres, and its lag
// behind the topic's end offset when brokers were given.
type OffsetStats struct {
	Group      string    `json:"group"`
	Topic      string    `json:"topic"`
	Partition  int       `json:"partition"`
	NextOffset *int64    `json:"next_offset"`
	Generation int32     `json:"generation"`
	UpdatedAt  time.Time `json:"updated_at"`
	EndOffset  *int64    `json:"end_offset,omitempty"`
	Lag        *int64    `json:"lag,omitempty"`
}

func (a *app) statsCmd() *cobra.Command {
	var (
		scope, group string
		brokers      []string
		asJSON       bool
		conn         kafkaConn
	)
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Report markers, parked messages, table sizes and Kafka lag per scope",
		Long: `Report, per scope, the markers of the strategy named by --strategy (their
number and the oldest one's time; for highwater, the senders and their oldest
update) and the parked messages by reason; the size of each table on disk;
and the Kafka offsets stored in Postgres. With --brokers, each stored offset
is compared with its partition's end offset: the difference is the lag.

Counting markers reads the whole markers table; on very large tables it takes
a while, but it only reads.

` + kafkaConnHelp,
		Example: `  effectively stats
  effectively stats --scope ledger --brokers kafka:9092 --json
  effectively stats --brokers kafka:9093 --tls-ca ca.pem --tls-cert client.pem --tls-key client-key.pem`,
		Args: cobra.NoArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			if err := conn.fromEnv(cmd.Flags()); err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			rep, err := a.stats(ctx, pool, scope, group, cmd.Flag("schema").Changed, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if len(brokers) > 0 {
				if err := a.addLag(ctx, brokers, &conn, cmd.ErrOrStderr(), rep); err != nil {
					return err
				}
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			printStats(cmd.OutOrStdout(), rep)
			return nil
		}),
	}
	f := cmd.Flags()
	f.StringVar(&scope, "scope", "", "report only this scope")
	f.StringVar(&group, "group", "", "report only the Kafka offsets of this consumer group")
	f.StringSliceVar(&brokers, "brokers", nil, "Kafka brokers (host:port, comma-separated), to report lag")
	conn = a.kafkaConn()
	conn.addFlags(f)
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// stats reads the report. A schema named by --schema that does not exist
// is an error (most likely a misspelt name); the default schema missing is
// a database not migrated yet, reported with every table missing.
func (a *app) stats(ctx context.Context, pool *pgxpool.Pool, scope, group string, schemaGiven bool, stderr io.Writer) (*StatsReport, error) {
	s, err := a.strategy()
	if err != nil {
		return nil, err
	}
	var schemaExists bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, a.schema).Scan(&schemaExists); err != nil {
		return nil, err
	}
	switch {
	case !schemaExists && !schemaGiven:
		fmt.Fprintf(stderr, "schema %s does not exist yet: run %q to create the library's tables\n", showRef(a.schema), a.opts.Name+" migrate")
	case !schemaExists:
		return nil, fmt.Errorf("schema %s does not exist in this database: give the --schema the consumers use (Config.Schema; default %q), or run %q to create the library's tables",
			showRef(a.schema), pg.DefaultSchema, a.opts.Name+" migrate")
	}
	rep := &StatsReport{Strategy: s.Name(), Scopes: []ScopeStats{}, KafkaOffsets: []OffsetStats{}}
	scopes := map[string]*ScopeStats{}
	get := func(name string) *ScopeStats {
		if st, ok := scopes[name]; ok {
			return st
		}
		st := &ScopeStats{Scope: name}
		scopes[name] = st
		return st
	}

	if insp, ok := s.(dedupe.Inspector); ok {
		ms, err := insp.MarkerStats(ctx, pool, scope)
		if err != nil {
			return nil, err
		}
		rep.MarkersTable, rep.Details = ms.Table, ms.Details
		for _, t := range ms.Tables {
			rep.Tables = append(rep.Tables, TableStats{Table: t.Table, Exists: t.Exists, Bytes: t.Bytes})
		}
		for _, sm := range ms.Scopes {
			st := get(sm.Scope)
			st.Markers, st.OldestMarker, st.NewestMarker = sm.Markers, sm.Oldest, sm.Newest
		}
	}

	ok, err := a.tableStats(ctx, pool, rep, a.parkedIdent())
	if err != nil {
		return nil, err
	}
	if ok {
		counts, err := parked.NewStore(pool, a.schema, a.parkedTable).CountByReason(ctx, scope)
		if err != nil {
			return nil, err
		}
		for _, c := range counts {
			st := get(c.Scope)
			if st.ParkedBy == nil {
				st.ParkedBy = map[string]int64{}
			}
			st.ParkedBy[c.Reason] = c.Rows
			st.Parked += c.Rows
			if st.OldestParked == nil || c.Oldest.Before(*st.OldestParked) {
				o := c.Oldest
				st.OldestParked = &o
			}
		}
	}

	offs := a.offsets()
	ok, err = a.tableStats(ctx, pool, rep, offs.Table())
	if err != nil {
		return nil, err
	}
	if ok {
		stored, err := offs.List(ctx, pool, group)
		if err != nil {
			return nil, err
		}
		for _, so := range stored {
			rep.KafkaOffsets = append(rep.KafkaOffsets, OffsetStats{Group: so.Group, Topic: so.Topic, Partition: so.Partition,
				NextOffset: so.Next, Generation: so.Generation, UpdatedAt: so.UpdatedAt})
		}
	}
	for _, st := range scopes {
		rep.Scopes = append(rep.Scopes, *st)
	}
	sort.Slice(rep.Scopes, func(i, j int) bool { return rep.Scopes[i].Scope < rep.Scopes[j].Scope })
	return rep, nil
}

// tableStats records table's size, and reports whether it exists.
func (a *app) tableStats(ctx context.Context, pool *pgxpool.Pool, rep *StatsReport, table string) (bool, error) {
	ts, err := dedupe.SizeOf(ctx, pool, table)
	if err != nil {
		return false, err
	}
	rep.Tables = append(rep.Tables, TableStats{Table: ts.Table, Exists: ts.Exists, Bytes: ts.Bytes})
	return ts.Exists, nil
}

// addLag fills in end offsets and lag from the brokers.
func (a *app) addLag(ctx context.Context, brokers []string, conn *kafkaConn, stderr io.Writer, rep *StatsReport) error {
	kc, err := newKafkaClient(ctx, brokers, conn, stderr)
	if err != nil {
		return err
	}
	defer kc.close()
	byTopic := map[string][]int{}
	for _, o := range rep.KafkaOffsets {
		byTopic[o.Topic] = append(byTopic[o.Topic], o.Partition)
	}
	ends := map[string]map[int]int64{}
	for topic, parts := range byTopic {
		sort.Ints(parts)
		parts = compactInts(parts)
		_, end, err := kc.bounds(ctx, topic, parts)
		if err != nil {
			return err
		}
		ends[topic] = end
	}
	for i := range rep.KafkaOffsets {
		o := &rep.KafkaOffsets[i]
		if e, ok := ends[o.Topic][o.Partition]; ok {
			end := e
			o.EndOffset = &end
			if o.NextOffset != nil {
				lag := max(end-*o.NextOffset, 0)
				o.Lag = &lag
			}
		}
	}
	return nil
}

func compactInts(s []int) []int {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

func printStats(w io.Writer, rep *StatsReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "strategy %s, markers in %s%s\n\n", rep.Strategy, orDash(rep.MarkersTable), details(rep.Details))
	fmt.Fprintln(tw, "SCOPE\tMARKERS\tOLDEST MARKER\tPARKED\tBY REASON\tOLDEST PARKED")
	for _, s := range rep.Scopes {
		var by []string
		for r, n := range s.ParkedBy {
			by = append(by, fmt.Sprintf("%s=%d", r, n))
		}
		sort.Strings(by)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\n", s.Scope, s.Markers, fmtTime(s.OldestMarker), s.Parked, orDash(strings.Join(by, " ")), fmtTime(s.OldestParked))
	}
	if len(rep.Scopes) == 0 {
		fmt.Fprintln(tw, "(none)")
	}
	fmt.Fprintln(tw, "\nTABLE\tSIZE")
	for _, t := range rep.Tables {
		size := "missing"
		if t.Exists {
			size = fmtBytes(t.Bytes)
		}
		fmt.Fprintf(tw, "%s\t%s\n", t.Table, size)
	}
	if len(rep.KafkaOffsets) > 0 {
		fmt.Fprintln(tw, "\nGROUP\tTOPIC\tPARTITION\tSTORED NEXT OFFSET\tGENERATION\tEND OFFSET\tLAG\tUPDATED")
		for _, o := range rep.KafkaOffsets {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\n", o.Group, o.Topic, o.Partition, fmtInt(o.NextOffset), o.Generation,
				fmtInt(o.EndOffset), fmtInt(o.Lag), o.UpdatedAt.UTC().Format(time.RFC3339))
		}
	}
	_ = tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func fmtInt(v *int64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprint(*v)
}

func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// details renders a strategy's details as " (k=v, …)", sorted by name.
func details(d map[string]string) string {
	if len(d) == 0 {
		return ""
	}
	kv := make([]string, 0, len(d))
	for k, v := range d {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return " (" + strings.Join(kv, ", ") + ")"
}
