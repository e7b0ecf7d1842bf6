package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// ParkedMessage is one parked row, as "parked list --json" and
// "parked show --json" print it. Payload and Key are base64 when they are
// not valid text (PayloadBase64, KeyBase64 say so).
type ParkedMessage struct {
	ID            int64           `json:"id"`
	Consumer      string          `json:"consumer"`
	Scope         string          `json:"scope"`
	DedupeID      *string         `json:"dedupe_id"`
	Sender        *string         `json:"sender,omitempty"`
	Seq           *int64          `json:"seq,omitempty"`
	HasMarker     bool            `json:"has_marker"`
	Source        string          `json:"source"`
	Lane          string          `json:"lane"`
	Ref           string          `json:"ref"`
	Key           string          `json:"key,omitempty"`
	KeyBase64     bool            `json:"key_base64,omitempty"`
	Payload       string          `json:"payload"`
	PayloadBase64 bool            `json:"payload_base64,omitempty"`
	Headers       json.RawMessage `json:"headers"`
	MessageTime   *time.Time      `json:"message_time,omitempty"`
	Attempts      int32           `json:"attempts"`
	Reason        string          `json:"reason"`
	LastError     string          `json:"last_error"`
	ParkedAt      time.Time       `json:"parked_at"`
}

// parkedFilter selects parked rows.
type parkedFilter struct {
	scope, reason string
	ids           []int64
	limit         int
	olderThan     time.Duration
}

func (f *parkedFilter) flags(fs *pflag.FlagSet, limit int) {
	fs.StringVar(&f.scope, "scope", "", "only rows of this scope")
	fs.StringVar(&f.reason, "reason", "", "only rows parked for this reason (invalid_key, permanent, max_attempts, mismatch, gap)")
	fs.Int64SliceVar(&f.ids, "id", nil, "only these row ids (repeat or comma-separate)")
	fs.IntVar(&f.limit, "limit", limit, "at most this many rows (0: no limit)")
}

// where returns the filter as a WHERE clause on $1…$4.
func (f *parkedFilter) where() (string, []any) {
	var ids []int64
	if len(f.ids) > 0 {
		ids = f.ids
	}
	return `($1 = '' OR scope = $1) AND ($2 = '' OR reason = $2) AND ($3::bigint[] IS NULL OR id = ANY($3))
    AND ($4::bigint = 0 OR parked_at < now() - $4::bigint * interval '1 microsecond')`,
		[]any{f.scope, f.reason, ids, f.olderThan.Microseconds()}
}

func (a *app) parkedCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "parked",
		Short: "List, show, redrive and purge parked messages",
		Long: `Parked messages are the ones a consumer could not apply: no usable dedupe key
(invalid_key), a permanent handler error (permanent), too many failures
(max_attempts), a key reused with another payload (mismatch) or a sequence
gap that never closed (gap). Each is kept whole in the parked table.`,
	}
	cmd.AddCommand(a.parkedListCmd(), a.parkedShowCmd(), a.redriveCmd(), a.purgeCmd())
	return cmd
}

const parkedColumns = `id, consumer, scope, dedupe_id, sender, seq, has_marker, source, lane, ref,
    msg_key, payload, headers, message_time, attempts, reason, last_error, parked_at`

func scanParked(rows pgx.Rows) ([]ParkedMessage, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (ParkedMessage, error) {
		var p ParkedMessage
		var key, payload, headers []byte
		err := r.Scan(&p.ID, &p.Consumer, &p.Scope, &p.DedupeID, &p.Sender, &p.Seq, &p.HasMarker, &p.Source, &p.Lane, &p.Ref,
			&key, &payload, &headers, &p.MessageTime, &p.Attempts, &p.Reason, &p.LastError, &p.ParkedAt)
		p.Key, p.KeyBase64 = textOrBase64(key)
		p.Payload, p.PayloadBase64 = textOrBase64(payload)
		p.Headers = headers
		return p, err
	})
}

func textOrBase64(b []byte) (string, bool) {
	if utf8.Valid(b) && !strings.ContainsRune(string(b), 0) {
		return string(b), false
	}
	return base64.StdEncoding.EncodeToString(b), true
}

func (a *app) queryParked(ctx context.Context, pool *pgxpool.Pool, f *parkedFilter) ([]ParkedMessage, error) {
	where, args := f.where()
	var limit *int64
	if f.limit > 0 {
		l := int64(f.limit)
		limit = &l
	}
	rows, err := pool.Query(ctx, `SELECT `+parkedColumns+` FROM `+a.parkedIdent()+` WHERE `+where+` ORDER BY id LIMIT $5`, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("parked: %w", err)
	}
	out, err := scanParked(rows)
	if err != nil {
		return nil, fmt.Errorf("parked: %w", err)
	}
	return out, nil
}

func (a *app) parkedListCmd() *cobra.Command {
	var f parkedFilter
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List parked messages, oldest first",
		Example: `  effectively parked list --scope ledger --reason permanent
  effectively parked list --json --limit 0`,
		Args: cobra.NoArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			ps, err := a.queryParked(ctx, pool, &f)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), ps)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSCOPE\tREASON\tATTEMPTS\tPARKED AT\tREF\tDEDUPE KEY\tLAST ERROR")
			for _, p := range ps {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", p.ID, p.Scope, p.Reason, p.Attempts,
					p.ParkedAt.UTC().Format(time.RFC3339), orDash(p.Ref), orDash(keyString(p)), shorten(p.LastError, 60))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if f.limit > 0 && len(ps) == f.limit {
				fmt.Fprintf(cmd.ErrOrStderr(), "(showing the first %d; --limit 0 shows all)\n", f.limit)
			}
			return nil
		}),
	}
	f.flags(cmd.Flags(), 100)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func keyString(p ParkedMessage) string {
	switch {
	case p.Sender != nil && p.Seq != nil:
		return fmt.Sprintf("%s#%d", *p.Sender, *p.Seq)
	case p.DedupeID != nil:
		return *p.DedupeID
	}
	return ""
}

func shorten(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

func (a *app) parkedShowCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "show ID...",
		Short:   "Show parked messages whole: payload, headers, key and error",
		Example: `  effectively parked show 42`,
		Args:    cobra.MinimumNArgs(1),
		RunE: a.runE(func(cmd *cobra.Command, args []string) error {
			f := parkedFilter{}
			for _, s := range args {
				var id int64
				if _, err := fmt.Sscan(s, &id); err != nil {
					return fmt.Errorf("%q is not a parked-row id", s)
				}
				f.ids = append(f.ids, id)
			}
			ctx := cmd.Context()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			ps, err := a.queryParked(ctx, pool, &f)
			if err != nil {
				return err
			}
			if len(ps) < len(f.ids) {
				found := map[int64]bool{}
				for _, p := range ps {
					found[p.ID] = true
				}
				for _, id := range f.ids {
					if !found[id] {
						return fmt.Errorf("no parked message with id %d in %s", id, a.parkedIdent())
					}
				}
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), ps)
			}
			for i, p := range ps {
				if i > 0 {
					fmt.Fprintln(cmd.OutOrStdout())
				}
				printParked(cmd.OutOrStdout(), p)
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printParked(w io.Writer, p ParkedMessage) {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	enc := func(base64 bool) string {
		if base64 {
			return " (base64)"
		}
		return ""
	}
	fmt.Fprintf(tw, "id:\t%d\n", p.ID)
	fmt.Fprintf(tw, "consumer:\t%s\n", p.Consumer)
	fmt.Fprintf(tw, "scope:\t%s\n", p.Scope)
	fmt.Fprintf(tw, "dedupe key:\t%s\n", orDash(keyString(p)))
	fmt.Fprintf(tw, "has marker:\t%t\n", p.HasMarker)
	fmt.Fprintf(tw, "source:\t%s\n", p.Source)
	fmt.Fprintf(tw, "lane:\t%s\n", p.Lane)
	fmt.Fprintf(tw, "ref:\t%s\n", p.Ref)
	fmt.Fprintf(tw, "message time:\t%s\n", fmtTime(p.MessageTime))
	fmt.Fprintf(tw, "reason:\t%s\n", p.Reason)
	fmt.Fprintf(tw, "attempts:\t%d\n", p.Attempts)
	fmt.Fprintf(tw, "parked at:\t%s\n", p.ParkedAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "last error:\t%s\n", p.LastError)
	fmt.Fprintf(tw, "key%s:\t%s\n", enc(p.KeyBase64), p.Key)
	fmt.Fprintf(tw, "headers:\t%s\n", string(p.Headers))
	fmt.Fprintf(tw, "payload%s:\t%s\n", enc(p.PayloadBase64), p.Payload)
	_ = tw.Flush()
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (a *app) purgeCmd() *cobra.Command {
	var f parkedFilter
	var all bool
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete parked messages for good",
		Long: `Delete the parked messages selected by the filters, for good. A message parked
with a marker (has_marker: permanent, max_attempts, mismatch) stays recognised
as a duplicate if its source delivers it again; one parked without (invalid_key,
gap) would be processed again. It is safe while consumers run. Without
--scope, --reason, --id or --older-than it refuses unless --all is given.`,
		Example: `  effectively parked purge --scope ledger --reason permanent --older-than 720h
  effectively parked purge --id 42 --yes`,
		Args: cobra.NoArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			if !all && f.scope == "" && f.reason == "" && len(f.ids) == 0 && f.olderThan == 0 {
				return fmt.Errorf("no filter: give --scope, --reason, --id or --older-than, or --all to purge every parked message")
			}
			ctx := cmd.Context()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			where, args := f.where()
			var limit *int64
			if f.limit > 0 {
				l := int64(f.limit)
				limit = &l
			}
			args = append(args, limit)
			sel := `SELECT id FROM ` + a.parkedIdent() + ` WHERE ` + where + ` ORDER BY id LIMIT $5`
			var n int64
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM (`+sel+`) s`, args...).Scan(&n); err != nil {
				return fmt.Errorf("parked: %w", err)
			}
			out := cmd.OutOrStdout()
			if n == 0 {
				fmt.Fprintln(out, "no parked message matches")
				return nil
			}
			if err := a.confirm(cmd, fmt.Sprintf("Delete %d parked message(s) for good?", n)); err != nil {
				return err
			}
			tag, err := pool.Exec(ctx, `DELETE FROM `+a.parkedIdent()+` WHERE id IN (`+sel+`)`, args...)
			if err != nil {
				return fmt.Errorf("parked: %w", err)
			}
			fmt.Fprintf(out, "purged %d parked message(s)\n", tag.RowsAffected())
			return nil
		}),
	}
	f.flags(cmd.Flags(), 0)
	cmd.Flags().DurationVar(&f.olderThan, "older-than", 0, "only rows parked longer ago than this")
	cmd.Flags().BoolVar(&all, "all", false, "purge every parked message when no filter is given")
	return cmd
}
