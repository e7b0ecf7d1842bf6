package consumer

import (
	"context"
	"embed"
	"encoding/base64"
	"encoding/json"
	"io/fs"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
)

// Reasons a message is parked, stored in the parked table's reason column.
const (
	// ReasonInvalidKey: no usable dedupe key (missing, empty, too long, not
	// valid text, or the KeyFunc failed).
	ReasonInvalidKey = "invalid_key"
	// ReasonPermanent: the handler returned a permanent error (see Permanent),
	// such as a payload it cannot decode.
	ReasonPermanent = "permanent"
	// ReasonMaxAttempts: the handler failed Config.MaxAttempts times.
	ReasonMaxAttempts = "max_attempts"
	// ReasonMismatch: the key was processed before with another payload, and
	// Config.OnMismatch is MismatchPark.
	ReasonMismatch = "mismatch"
	// ReasonGap: the message waited Config.GapMaxAttempts deliveries for an
	// earlier sequence number that never came.
	ReasonGap = "gap"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// ParkedLine returns the migration line of the parked-messages table
// schema.table, for dedupe.Migrate or dedupe.MigrationSQL.
func ParkedLine(schema, table string) dedupe.Line {
	if schema == "" {
		schema = dedupe.DefaultSchema
	}
	if table == "" {
		table = "parked"
	}
	sub, _ := fs.Sub(migrationFiles, "migrations")
	return dedupe.Line{
		Name: "consumer:" + table,
		FS:   sub,
		Idents: map[string]string{
			"schema":        schema,
			"table":         table,
			"ref_idx":       table + "_ref_idx",
			"parked_at_idx": table + "_parked_at_idx",
		},
	}
}

// parkRow is one message to park.
type parkRow struct {
	it        *item
	reason    string
	err       error
	hasMarker bool
}

type headerJSON struct {
	Key         string `json:"key"`
	Value       string `json:"value,omitempty"`
	ValueBase64 string `json:"value_base64,omitempty"`
}

// encodeHeaders renders headers as JSON for the parked table: values that
// are valid text are kept as text, others in base64, so nothing is lost.
func encodeHeaders(hs []Header) string {
	out := make([]headerJSON, 0, len(hs))
	for _, h := range hs {
		j := headerJSON{Key: cleanText(h.Key)}
		if utf8.Valid(h.Value) && !strings.ContainsRune(string(h.Value), 0) {
			j.Value = string(h.Value)
		} else {
			j.ValueBase64 = base64.StdEncoding.EncodeToString(h.Value)
		}
		out = append(out, j)
	}
	b, _ := json.Marshal(out)
	return string(b)
}

// cleanText makes s storable in a text column: invalid UTF-8 and NUL bytes
// become U+FFFD.
func cleanText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

func textOrNil(s string, ok bool) *string {
	if !ok || s == "" {
		return nil
	}
	return &s
}

// insertParked writes rows in one statement. A message already parked
// (same scope, source and ref) is not parked twice.
func (c *Consumer) insertParked(ctx context.Context, tx pgx.Tx, rows []parkRow) error {
	if len(rows) == 0 {
		return nil
	}
	n := len(rows)
	var (
		consumers, scopes, sources, lanes, refs, reasons, lastErrs, headers = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		ids, senders                                                        = make([]*string, n), make([]*string, n)
		seqs                                                                = make([]*int64, n)
		fps, keys, payloads                                                 = make([][]byte, n), make([][]byte, n), make([][]byte, n)
		markers                                                             = make([]bool, n)
		attempts                                                            = make([]int32, n)
		times                                                               = make([]*time.Time, n)
	)
	for i, r := range rows {
		m, k := r.it.m, r.it.key
		valid := r.it.keyErr == nil
		consumers[i] = c.cfg.Name
		scopes[i] = c.cfg.Scope
		if valid {
			scopes[i] = k.Scope
		}
		ids[i] = textOrNil(k.ID, valid)
		senders[i] = textOrNil(k.Sender, valid)
		if valid && k.Seq != 0 {
			seq := k.Seq
			seqs[i] = &seq
		}
		if valid {
			fps[i] = k.Fingerprint
		}
		markers[i] = r.hasMarker
		sources[i] = cleanText(m.Source)
		lanes[i] = cleanText(m.Lane)
		refs[i] = cleanText(m.Ref)
		keys[i] = m.Key
		payloads[i] = m.Value
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
		headers[i] = encodeHeaders(m.Headers)
		if !m.Time.IsZero() {
			t := m.Time
			times[i] = &t
		}
		attempts[i] = int32(r.it.attempt())
		reasons[i] = r.reason
		if r.err != nil {
			lastErrs[i] = cleanText(r.err.Error())
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+c.parkedTable+` (consumer, scope, dedupe_id, sender, seq, fingerprint, has_marker,
    source, lane, ref, msg_key, payload, headers, message_time, attempts, reason, last_error)
SELECT c, s, id, snd, seq, fp, hm, src, lane, ref, k, p, h::jsonb, mt, att, rsn, le
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bytea[], $7::boolean[],
    $8::text[], $9::text[], $10::text[], $11::bytea[], $12::bytea[], $13::text[], $14::timestamptz[],
    $15::integer[], $16::text[], $17::text[])
    AS t(c, s, id, snd, seq, fp, hm, src, lane, ref, k, p, h, mt, att, rsn, le)
ON CONFLICT (scope, source, ref) WHERE ref <> '' DO NOTHING`,
		consumers, scopes, ids, senders, seqs, fps, markers,
		sources, lanes, refs, keys, payloads, headers, times,
		attempts, reasons, lastErrs)
	return err
}
