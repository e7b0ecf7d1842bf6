package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// ParkedMessage is one parked row (a parked.Row, read through
// parked.Store), as "parked list --json" and "parked show --json"
// print it: its JSON form, for people and scripts. Payload and Key are base64 when they are
// not valid text (PayloadBase64, KeyBase64 say so), and KeyNull and
// PayloadNull tell a nil key or payload (such as a Kafka tombstone's) from
// an empty one. Ref, Source and Lane are the value itself when it is valid
// text; otherwise they are quoted Go-style ("r\xff") and RefBase64,
// SourceBase64 and LaneBase64 hold the exact bytes.
type ParkedMessage struct {
	ID            int64           `json:"id"`
	Consumer      string          `json:"consumer"`
	Scope         string          `json:"scope"`
	DedupeID      *string         `json:"dedupe_id"`
	Sender        *string         `json:"sender,omitempty"`
	Seq           *int64          `json:"seq,omitempty"`
	HasMarker     bool            `json:"has_marker"`
	Source        string          `json:"source"`
	SourceBase64  string          `json:"source_base64,omitempty"`
	Lane          string          `json:"lane"`
	LaneBase64    string          `json:"lane_base64,omitempty"`
	Ref           string          `json:"ref"`
	RefBase64     string          `json:"ref_base64,omitempty"`
	Key           string          `json:"key,omitempty"`
	KeyBase64     bool            `json:"key_base64,omitempty"`
	KeyNull       bool            `json:"key_null,omitempty"`
	Payload       string          `json:"payload"`
	PayloadBase64 bool            `json:"payload_base64,omitempty"`
	PayloadNull   bool            `json:"payload_null,omitempty"`
	Headers       json.RawMessage `json:"headers"`
	MessageTime   *time.Time      `json:"message_time,omitempty"`
	Attempts      int32           `json:"attempts"`
	Reason        string          `json:"reason"`
	LastError     string          `json:"last_error"`
	// ParkCount is how many times this message was parked: the same
	// message delivered and parked again shares its row.
	ParkCount int32 `json:"park_count"`
	// ParkedAt is when it was first parked, LastParkedAt the latest time.
	ParkedAt     time.Time `json:"parked_at"`
	LastParkedAt time.Time `json:"last_parked_at"`

	// The exact ref, source and lane.
	ref, source, lane string
}

// parkedFilter selects parked rows.
type parkedFilter struct {
	scope, reason string
	ids           []int64
	refFlags      []string
	limit         int
	olderThan     time.Duration
}

func (f *parkedFilter) flags(fs *pflag.FlagSet, limit int) {
	fs.StringVar(&f.scope, "scope", "", "only rows of this scope")
	fs.StringVar(&f.reason, "reason", "", "only rows parked for this reason (invalid_key, permanent, max_attempts, mismatch, gap)")
	fs.Int64SliceVar(&f.ids, "id", nil, "only these row ids (repeat or comma-separate)")
	fs.StringArrayVar(&f.refFlags, "ref", nil, `only rows with this ref, as "parked list" shows it: plain, or quoted Go-style for refs that are not plain text ("r\xff"); repeat for several`)
	fs.IntVar(&f.limit, "limit", limit, "at most this many rows (0: no limit)")
}

// refs returns the --ref values, unquoted.
func (f *parkedFilter) refs() ([]string, error) {
	out := make([]string, 0, len(f.refFlags))
	for _, r := range f.refFlags {
		ref, err := parseRef(r)
		if err != nil {
			return nil, err
		}
		out = append(out, ref)
	}
	return out, nil
}

// parkReasons are the reasons a row can be parked for.
var parkReasons = []string{parked.ReasonInvalidKey, parked.ReasonPermanent, parked.ReasonMaxAttempts,
	parked.ReasonMismatch, parked.ReasonGap}

// checkReason refuses a --reason no row can have, which would select
// nothing without saying why.
func checkReason(reason string) error {
	if reason == "" || slices.Contains(parkReasons, reason) {
		return nil
	}
	return fmt.Errorf("--reason: %q is not a reason a message is parked for: use one of %s", reason, strings.Join(parkReasons, ", "))
}

// filter returns the selection as the parked store's filter.
func (f *parkedFilter) filter() (parked.Filter, error) {
	if err := checkReason(f.reason); err != nil {
		return parked.Filter{}, err
	}
	refs, err := f.refs()
	if err != nil {
		return parked.Filter{}, err
	}
	return parked.Filter{Scope: f.scope, Reason: f.reason, IDs: f.ids, Refs: refs, OlderThan: f.olderThan, Limit: f.limit}, nil
}

// showRef renders a ref (or source, lane) for a table: as it is when it is
// plain printable text without quotes or backslashes, else quoted
// Go-style. A shown ref starting with a double quote is therefore always
// quoted, and parseRef reads back what showRef shows.
func showRef(s string) string {
	if s == "" || strings.ContainsAny(s, `"\`) || strings.TrimSpace(s) != s || !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// parseRef reads a ref given as showRef shows it.
func parseRef(s string) (string, error) {
	if !strings.HasPrefix(s, `"`) {
		return s, nil
	}
	ref, err := strconv.Unquote(s)
	if err != nil {
		return "", fmt.Errorf("--ref %s: a ref starting with a double quote must be a complete Go-quoted string, such as \"r\\xff\"", s)
	}
	return ref, nil
}

// exactText returns b as text and "" when it is valid UTF-8 without NUL
// bytes; else b quoted Go-style and its base64.
func exactText(b []byte) (string, string) {
	if utf8.Valid(b) && !strings.ContainsRune(string(b), 0) {
		return string(b), ""
	}
	return strconv.Quote(string(b)), base64.StdEncoding.EncodeToString(b)
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

// parkedMessage is the JSON view of a parked row.
func parkedMessage(r parked.Row) ParkedMessage {
	p := ParkedMessage{
		ID: r.ID, Consumer: r.Consumer, Scope: r.Scope, DedupeID: r.DedupeID, Sender: r.Sender, Seq: r.Seq,
		HasMarker: r.HasMarker, Attempts: int32(r.Attempts), Reason: r.Reason, LastError: r.LastError,
		ParkCount: int32(r.ParkCount), ParkedAt: r.ParkedAt, LastParkedAt: r.LastParkedAt,
		ref: r.Ref, source: r.Source, lane: r.Lane,
	}
	if !r.MessageTime.IsZero() {
		t := r.MessageTime
		p.MessageTime = &t
	}
	p.Source, p.SourceBase64 = exactText([]byte(r.Source))
	p.Lane, p.LaneBase64 = exactText([]byte(r.Lane))
	p.Ref, p.RefBase64 = exactText([]byte(r.Ref))
	p.Key, p.KeyBase64 = textOrBase64(r.MsgKey)
	p.KeyNull = r.MsgKey == nil
	p.Payload, p.PayloadBase64 = textOrBase64(r.Payload)
	p.PayloadNull = r.Payload == nil
	p.Headers = json.RawMessage(r.HeadersJSON())
	return p
}

func textOrBase64(b []byte) (string, bool) {
	if utf8.Valid(b) && !strings.ContainsRune(string(b), 0) {
		return string(b), false
	}
	return base64.StdEncoding.EncodeToString(b), true
}

func (a *app) parked(ctx context.Context) (*parked.Store, error) {
	pool, err := a.db(ctx)
	if err != nil {
		return nil, err
	}
	return parked.NewStore(pool, a.schema, a.parkedTable), nil
}

func (a *app) queryParked(ctx context.Context, f *parkedFilter) ([]ParkedMessage, error) {
	pf, err := f.filter()
	if err != nil {
		return nil, err
	}
	store, err := a.parked(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := store.List(ctx, pf)
	if err != nil {
		return nil, err
	}
	out := make([]ParkedMessage, len(rows))
	for i, r := range rows {
		out[i] = parkedMessage(r)
	}
	return out, nil
}

func (a *app) parkedListCmd() *cobra.Command {
	var f parkedFilter
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List parked messages, oldest first",
		Long: `List parked messages, oldest first. COUNT is how many times the message was
parked: the same message (same source, ref, key, payload and headers)
delivered and parked again shares its row, while another message under the
same ref has a row of its own. A ref (source, lane) that is not plain
printable text is shown quoted Go-style, such as "r\xff", and --ref takes it
in the same form.`,
		Example: `  effectively parked list --scope ledger --reason permanent
  effectively parked list --ref 'orders/3@1042' --ref '"r\xff"'
  effectively parked list --json --limit 0`,
		Args: cobra.NoArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			if _, err := f.filter(); err != nil {
				return err
			}
			ps, err := a.queryParked(cmd.Context(), &f)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), ps)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSCOPE\tREASON\tATTEMPTS\tCOUNT\tPARKED AT\tREF\tDEDUPE KEY\tLAST ERROR")
			for _, p := range ps {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", p.ID, p.Scope, p.Reason, p.Attempts, p.ParkCount,
					p.ParkedAt.UTC().Format(time.RFC3339), showRef(p.ref), orDash(keyString(p)), shorten(p.LastError, 60))
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
			ps, err := a.queryParked(cmd.Context(), &f)
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

// printParked shows one row whole. Key and payload are labelled "(null)"
// when nil (a Kafka tombstone's), "(empty)" when empty and "(base64)"
// when they are not text.
func printParked(w io.Writer, p ParkedMessage) {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	enc := func(null, base64 bool, s string) string {
		switch {
		case null:
			return " (null)"
		case base64:
			return " (base64)"
		case s == "":
			return " (empty)"
		}
		return ""
	}
	fmt.Fprintf(tw, "id:\t%d\n", p.ID)
	fmt.Fprintf(tw, "consumer:\t%s\n", p.Consumer)
	fmt.Fprintf(tw, "scope:\t%s\n", p.Scope)
	fmt.Fprintf(tw, "dedupe key:\t%s\n", orDash(keyString(p)))
	fmt.Fprintf(tw, "has marker:\t%t\n", p.HasMarker)
	fmt.Fprintf(tw, "source:\t%s\n", showRef(p.source))
	fmt.Fprintf(tw, "lane:\t%s\n", showRef(p.lane))
	fmt.Fprintf(tw, "ref:\t%s\n", showRef(p.ref))
	fmt.Fprintf(tw, "message time:\t%s\n", fmtTime(p.MessageTime))
	fmt.Fprintf(tw, "reason:\t%s\n", p.Reason)
	fmt.Fprintf(tw, "attempts:\t%d\n", p.Attempts)
	fmt.Fprintf(tw, "park count:\t%d\n", p.ParkCount)
	fmt.Fprintf(tw, "parked at:\t%s\n", p.ParkedAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "last parked at:\t%s\n", p.LastParkedAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "last error:\t%s\n", p.LastError)
	fmt.Fprintf(tw, "key%s:\t%s\n", enc(p.KeyNull, p.KeyBase64, p.Key), p.Key)
	fmt.Fprintf(tw, "headers:\t%s\n", string(p.Headers))
	fmt.Fprintf(tw, "payload%s:\t%s\n", enc(p.PayloadNull, p.PayloadBase64, p.Payload), p.Payload)
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
--scope, --reason, --id, --ref or --older-than it refuses unless --all is
given. A row stands for every parking of its message (see COUNT in "parked
list"): purging it purges them all.`,
		Example: `  effectively parked purge --scope ledger --reason permanent --older-than 720h
  effectively parked purge --id 42 --yes`,
		Args: cobra.NoArgs,
		RunE: a.runE(func(cmd *cobra.Command, _ []string) error {
			if !all && f.scope == "" && f.reason == "" && len(f.ids) == 0 && len(f.refFlags) == 0 && f.olderThan == 0 {
				return fmt.Errorf("no filter: give --scope, --reason, --id, --ref or --older-than, or --all to purge every parked message")
			}
			pf, err := f.filter()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			store, err := a.parked(ctx)
			if err != nil {
				return err
			}
			// The rows counted in the question are the rows deleted: one
			// parked while the question waits is left alone.
			ids, err := store.IDs(ctx, pf)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(ids) == 0 {
				fmt.Fprintln(out, "no parked message matches")
				return nil
			}
			if err := a.confirm(cmd, fmt.Sprintf("Delete %d parked message(s) for good?", len(ids))); err != nil {
				return err
			}
			pf.IDs, pf.Limit = ids, 0
			deleted, err := store.Delete(ctx, pf)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "purged %d parked message(s)\n", deleted)
			return nil
		}),
	}
	f.flags(cmd.Flags(), 0)
	cmd.Flags().DurationVar(&f.olderThan, "older-than", 0, "only rows parked longer ago than this")
	cmd.Flags().BoolVar(&all, "all", false, "purge every parked message when no filter is given")
	return cmd
}
