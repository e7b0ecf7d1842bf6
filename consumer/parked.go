package consumer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io/fs"
	"strconv"
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
//
// A row holds one message whole, as delivered: ref_bytes, msg_key, payload
// and headers are exact (a nil key or payload is NULL, an empty one an
// empty bytea; header values that are not text are kept in base64, a nil
// header value as "null": true), and ref, source and lane are readable
// text: the value itself when it is valid UTF-8 without NUL bytes, else
// quoted Go-style (such as "r\xff"), with the exact bytes in ref_bytes,
// source_bytes and lane_bytes. No parked delivery is dropped: the same
// message (same scope, source, ref, key, payload and headers) parked again
// keeps its row, whose park_count and last_parked_at count the parkings
// and whose reason and last_error are the newest; any other message, even
// under the same ref, gets a row of its own.
func ParkedLine(schema, table string) dedupe.Line {
	if schema == "" {
		schema = dedupe.DefaultSchema
	}
	if table == "" {
		table = DefaultParkedTable
	}
	sub, _ := fs.Sub(migrationFiles, "migrations")
	return dedupe.Line{
		Name: "consumer:" + table,
		FS:   sub,
		Idents: map[string]string{
			"schema":           schema,
			"table":            table,
			"ref_idx":          table + "_ref_idx",
			"parked_at_idx":    table + "_parked_at_idx",
			"message_hash_idx": table + "_message_hash_idx",
			"ref_bytes_idx":    table + "_ref_bytes_idx",
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
	Key string `json:"key"`
	// KeyBase64 is the exact key when it is not valid text (Key is then a
	// quoted rendering).
	KeyBase64   string `json:"key_base64,omitempty"`
	Value       string `json:"value,omitempty"`
	ValueBase64 string `json:"value_base64,omitempty"`
	// Null is true for a nil value, as opposed to an empty one.
	Null bool `json:"null,omitempty"`
}

// encodeHeaders renders headers as JSON for the parked table: keys and
// values that are valid text are kept as text, others in base64, and nil
// values are told from empty ones, so nothing is lost.
func encodeHeaders(hs []Header) string {
	out := make([]headerJSON, 0, len(hs))
	for _, h := range hs {
		var j headerJSON
		var exact bool
		j.Key, exact = renderText(h.Key)
		if !exact {
			j.KeyBase64 = base64.StdEncoding.EncodeToString([]byte(h.Key))
		}
		switch {
		case h.Value == nil:
			j.Null = true
		case isText(h.Value):
			j.Value = string(h.Value)
		default:
			j.ValueBase64 = base64.StdEncoding.EncodeToString(h.Value)
		}
		out = append(out, j)
	}
	b, _ := json.Marshal(out)
	return string(b)
}

// isText reports whether b can be stored in a text column as it is: valid
// UTF-8 without NUL bytes.
func isText(b []byte) bool {
	return utf8.Valid(b) && bytes.IndexByte(b, 0) < 0
}

// renderText returns s when it can be stored in a text column as it is,
// and exact true; otherwise s quoted Go-style ("r\xff"), which is valid
// text and tells every byte.
func renderText(s string) (text string, exact bool) {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s, true
	}
	return strconv.Quote(s), false
}

// bytesIfInexact returns s's bytes when renderText cannot store it as it
// is, and nil otherwise.
func bytesIfInexact(s string) []byte {
	if _, exact := renderText(s); exact {
		return nil
	}
	return []byte(s)
}

// cleanText makes s storable in a text column: invalid UTF-8 and NUL bytes
// become U+FFFD. It is for messages meant to be read (errors), not for
// what must be kept exactly.
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

// messageHash identifies a parked message: scope, source, ref, key, payload
// and headers, each nil told from empty. The same delivery, or a
// redelivery of the same stored message, has the same hash; another message
// under the same ref has another. Lane, time, attempt and the dedupe key
// are left out: a redelivery may come through another lane (an SQS
// receiver), and the dedupe key follows from the rest. Unlike
// dedupe.Fingerprint, which hashes only the payload's bytes (so that a
// redelivery is a duplicate however a source reports an empty value), it
// tells a nil payload from an empty one: a tombstone and an empty message
// are two rows.
func messageHash(scope string, m *Message) []byte {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	str := func(s string) {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	opt := func(b []byte) {
		if b == nil {
			h.Write([]byte{0})
			return
		}
		h.Write([]byte{1})
		str(string(b))
	}
	str("effectively.parked/1")
	str(scope)
	str(m.Source)
	str(m.Ref)
	opt(m.Key)
	opt(m.Value)
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(m.Headers)))])
	for _, hd := range m.Headers {
		str(hd.Key)
		opt(hd.Value)
	}
	return h.Sum(nil)
}

// parkCols is one row of the parked insert.
type parkCols struct {
	hash                             []byte
	count                            int32
	scope, source, lane, ref         string
	sourceBytes, laneBytes, refBytes []byte
	dedupeID, sender                 *string
	seq                              *int64
	fp, key, payload                 []byte
	hasKey, hasMarker                bool
	headers, reason, lastErr         string
	messageTime                      *time.Time
	attempts                         int32
}

// merge folds a later parking of the same message into p, as the insert's
// ON CONFLICT clause folds one into a stored row: one more parking, the
// most attempts, the newest reason and error, and the newest key when the
// newer parking has one. A marker written with the row stands for as long
// as the row keeps the key it was written for.
func (p *parkCols) merge(q *parkCols) {
	p.count += q.count
	p.attempts = max(p.attempts, q.attempts)
	p.reason, p.lastErr = q.reason, q.lastErr
	if q.hasKey {
		same := p.hasKey && eqStr(p.dedupeID, q.dedupeID) && eqStr(p.sender, q.sender) && eqInt(p.seq, q.seq)
		p.hasMarker = q.hasMarker || (p.hasMarker && same)
		p.hasKey, p.dedupeID, p.sender, p.seq, p.fp = true, q.dedupeID, q.sender, q.seq, q.fp
	}
}

func eqStr(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
func eqInt(a, b *int64) bool  { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func (c *Consumer) parkCols(r parkRow) *parkCols {
	m, k := r.it.m, r.it.key
	valid := r.it.keyErr == nil
	p := &parkCols{count: 1, scope: c.cfg.Scope, hasKey: valid, hasMarker: r.hasMarker}
	if valid {
		p.scope = k.Scope
		p.dedupeID, p.sender = textOrNil(k.ID, true), textOrNil(k.Sender, true)
		if k.Seq != 0 {
			seq := k.Seq
			p.seq = &seq
		}
		p.fp = k.Fingerprint
	}
	p.hash = messageHash(p.scope, m)
	p.source, _ = renderText(m.Source)
	p.lane, _ = renderText(m.Lane)
	p.ref, _ = renderText(m.Ref)
	p.sourceBytes, p.laneBytes, p.refBytes = bytesIfInexact(m.Source), bytesIfInexact(m.Lane), []byte(m.Ref)
	// Nil stays nil (NULL) and empty stays empty: a Kafka tombstone is
	// not an empty message.
	p.key, p.payload = m.Key, m.Value
	p.headers = encodeHeaders(m.Headers)
	if !m.Time.IsZero() {
		t := m.Time
		p.messageTime = &t
	}
	p.attempts = int32(r.it.attempt())
	p.reason = r.reason
	if r.err != nil {
		p.lastErr = cleanText(r.err.Error())
	}
	return p
}

// insertParked writes rows in one statement. Rows of the same message (the
// same delivery twice in a batch, or a message parked before) are folded
// into one row that counts them: first here, since one statement cannot
// update a row twice, then by the statement's ON CONFLICT clause.
func (c *Consumer) insertParked(ctx context.Context, tx pgx.Tx, rows []parkRow) error {
	if len(rows) == 0 {
		return nil
	}
	byHash := make(map[string]*parkCols, len(rows))
	ps := make([]*parkCols, 0, len(rows))
	for _, r := range rows {
		p := c.parkCols(r)
		if q, ok := byHash[string(p.hash)]; ok {
			q.merge(p)
			continue
		}
		byHash[string(p.hash)] = p
		ps = append(ps, p)
	}
	// Rows keep the order of the batch: ids follow the order messages were
	// parked in, which is the order Redrive takes them.
	n := len(ps)
	var (
		consumers, scopes, sources, lanes, refs, reasons, lastErrs, headers = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		ids, senders                                                        = make([]*string, n), make([]*string, n)
		seqs                                                                = make([]*int64, n)
		fps, keys, payloads, hashes, refBytes, srcBytes, laneBytes          = make([][]byte, n), make([][]byte, n), make([][]byte, n), make([][]byte, n), make([][]byte, n), make([][]byte, n), make([][]byte, n)
		markers                                                             = make([]bool, n)
		attempts, counts                                                    = make([]int32, n), make([]int32, n)
		times                                                               = make([]*time.Time, n)
	)
	for i, p := range ps {
		consumers[i], scopes[i], ids[i], senders[i], seqs[i], fps[i], markers[i] = c.cfg.Name, p.scope, p.dedupeID, p.sender, p.seq, p.fp, p.hasMarker
		sources[i], lanes[i], refs[i], keys[i], payloads[i], headers[i], times[i] = p.source, p.lane, p.ref, p.key, p.payload, p.headers, p.messageTime
		attempts[i], reasons[i], lastErrs[i] = p.attempts, p.reason, p.lastErr
		hashes[i], counts[i], refBytes[i], srcBytes[i], laneBytes[i] = p.hash, p.count, p.refBytes, p.sourceBytes, p.laneBytes
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+c.parkedTable+` AS p (consumer, scope, dedupe_id, sender, seq, fingerprint, has_marker,
    source, lane, ref, msg_key, payload, headers, message_time, attempts, reason, last_error,
    message_hash, park_count, ref_bytes, source_bytes, lane_bytes)
SELECT c, s, id, snd, seq, fp, hm, src, lane, ref, k, v, h::jsonb, mt, att, rsn, le, mh, pc, rb, sb, lb
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bytea[], $7::boolean[],
    $8::text[], $9::text[], $10::text[], $11::bytea[], $12::bytea[], $13::text[], $14::timestamptz[],
    $15::integer[], $16::text[], $17::text[], $18::bytea[], $19::integer[], $20::bytea[], $21::bytea[], $22::bytea[])
    AS t(c, s, id, snd, seq, fp, hm, src, lane, ref, k, v, h, mt, att, rsn, le, mh, pc, rb, sb, lb)
ON CONFLICT (message_hash) DO UPDATE SET
    park_count = p.park_count + excluded.park_count,
    last_parked_at = now(),
    attempts = greatest(p.attempts, excluded.attempts),
    reason = excluded.reason,
    last_error = excluded.last_error,
    has_marker = CASE WHEN excluded.dedupe_id IS NULL AND excluded.sender IS NULL THEN p.has_marker
        ELSE excluded.has_marker OR (p.has_marker AND p.dedupe_id IS NOT DISTINCT FROM excluded.dedupe_id
            AND p.sender IS NOT DISTINCT FROM excluded.sender AND p.seq IS NOT DISTINCT FROM excluded.seq) END,
    dedupe_id = CASE WHEN excluded.dedupe_id IS NULL AND excluded.sender IS NULL THEN p.dedupe_id ELSE excluded.dedupe_id END,
    sender = CASE WHEN excluded.dedupe_id IS NULL AND excluded.sender IS NULL THEN p.sender ELSE excluded.sender END,
    seq = CASE WHEN excluded.dedupe_id IS NULL AND excluded.sender IS NULL THEN p.seq ELSE excluded.seq END,
    fingerprint = CASE WHEN excluded.dedupe_id IS NULL AND excluded.sender IS NULL THEN p.fingerprint ELSE excluded.fingerprint END`,
		consumers, scopes, ids, senders, seqs, fps, markers,
		sources, lanes, refs, keys, payloads, headers, times,
		attempts, reasons, lastErrs, hashes, counts, refBytes, srcBytes, laneBytes)
	return err
}
