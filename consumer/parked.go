package consumer

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"time"

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

// ParkedRow is one row of the parked table: a message kept whole, why it
// was parked and how often. ParkedStore reads and writes it; it is the one
// shape of a parked message in the library.
type ParkedRow struct {
	// ID is the row's id, given by the table; it orders rows as they were
	// first parked. Ignored by InsertTx.
	ID int64
	// Consumer is the name of the consumer that parked the message.
	Consumer string
	// Scope is the dedupe scope the message belongs to.
	Scope string

	// The dedupe key, when the message had a valid one: DedupeID or Sender
	// is not nil. Both nil: the message was parked without a key
	// (ReasonInvalidKey).
	DedupeID    *string
	Sender      *string
	Seq         *int64
	Fingerprint []byte
	// HasMarker is true when a dedupe marker was written with the row: a
	// redelivery of the message is then a duplicate, and a redrive applies
	// it without claiming the key again.
	HasMarker bool

	// The message, exactly as delivered: Source, Lane and Ref byte for
	// byte, MsgKey and Payload nil when the message had none (a Kafka
	// tombstone) and empty when empty.
	Source      string
	Lane        string
	Ref         string
	MsgKey      []byte
	Payload     []byte
	Headers     []Header
	MessageTime time.Time // zero when the source did not say

	// Attempts is how many deliveries failed before the message was parked
	// (and redrives after).
	Attempts int
	// Reason is one of the Reason* constants; LastError the newest error.
	Reason    string
	LastError string
	// ParkCount is how many times this message was parked: the same
	// message (same scope, source, ref, key, payload and headers) parked
	// again shares its row. InsertTx takes 0 as 1.
	ParkCount int
	// ParkedAt is when the message was first parked, LastParkedAt the
	// latest time. Set by the table.
	ParkedAt     time.Time
	LastParkedAt time.Time
}

// HasKey reports whether the message was parked with a dedupe key.
func (p *ParkedRow) HasKey() bool { return p.DedupeID != nil || p.Sender != nil }

// DedupeKey returns the message's dedupe key, and false when it was parked
// without one.
func (p *ParkedRow) DedupeKey() (dedupe.Key, bool) {
	if !p.HasKey() {
		return dedupe.Key{}, false
	}
	k := dedupe.Key{Scope: p.Scope, Fingerprint: p.Fingerprint}
	if p.DedupeID != nil {
		k.ID = *p.DedupeID
	}
	if p.Sender != nil {
		k.Sender = *p.Sender
	}
	if p.Seq != nil {
		k.Seq = *p.Seq
	}
	return k, true
}

// Message rebuilds the parked message as a delivery, as a redrive hands it
// to the handler: Attempt is Attempts+1, and ID and DedupeKey are the
// parked key when there is one.
func (p *ParkedRow) Message() *Message {
	m := &Message{
		Key: p.MsgKey, Value: p.Payload, Headers: p.Headers, Time: p.MessageTime,
		Source: p.Source, Lane: p.Lane, Ref: p.Ref, Attempt: p.Attempts + 1,
	}
	if k, ok := p.DedupeKey(); ok {
		m.ID, m.DedupeKey = k.ID, k
	}
	return m
}

// HeadersJSON returns the headers as the table stores them: a JSON array
// of {"key", "value"} objects, where a key or value that is not valid text
// is in "key_base64" or "value_base64" and a nil value is "null": true.
func (p *ParkedRow) HeadersJSON() []byte { return []byte(encodeHeaders(p.Headers)) }

func (p ParkedRow) String() string {
	id := "<nil>"
	if p.DedupeID != nil {
		id = fmt.Sprintf("%q", *p.DedupeID)
	}
	return fmt.Sprintf("{ID:%d DedupeID:%s Reason:%s LastError:%q Payload:%q Ref:%q Source:%q Lane:%q Attempts:%d ParkCount:%d HasMarker:%v}",
		p.ID, id, p.Reason, p.LastError, p.Payload, p.Ref, p.Source, p.Lane, p.Attempts, p.ParkCount, p.HasMarker)
}

// ParkedStore is the parked table's one owner: every statement on the
// table is one of its methods. Methods without a pgx.Tx run in a
// transaction of their own on the store's database; the ...Tx methods run
// in the caller's transaction, so that what they do commits or rolls back
// with it.
type ParkedStore struct {
	db     dedupe.DB
	schema string
	table  string
	ident  string // quoted schema.table
}

// NewParkedStore returns the store of the parked table schema.table on db.
// schema defaults to "effectively" and table to "parked", as in Config. db
// may be nil when only the ...Tx methods are used.
func NewParkedStore(db dedupe.DB, schema, table string) *ParkedStore {
	if schema == "" {
		schema = dedupe.DefaultSchema
	}
	if table == "" {
		table = "parked"
	}
	return &ParkedStore{db: db, schema: schema, table: table, ident: pgx.Identifier{schema, table}.Sanitize()}
}

// Table returns the table's quoted name, schema.table.
func (s *ParkedStore) Table() string { return s.ident }

// Line returns the table's migration line (see ParkedLine).
func (s *ParkedStore) Line() dedupe.Line { return ParkedLine(s.schema, s.table) }

// Parked returns the store of the consumer's parked table, to list, count,
// purge or inspect what it parked.
func (c *Consumer) Parked() *ParkedStore {
	return NewParkedStore(c.db, c.cfg.Schema, c.cfg.ParkedTable)
}

// parkRow is one message to park.
type parkRow struct {
	it        *item
	reason    string
	err       error
	hasMarker bool
}

// insertParked writes rows in the batch's transaction; see
// ParkedStore.InsertTx.
func (c *Consumer) insertParked(ctx context.Context, tx pgx.Tx, rows []parkRow) error {
	if len(rows) == 0 {
		return nil
	}
	ps := make([]ParkedRow, len(rows))
	for i, r := range rows {
		ps[i] = c.parkedRow(r)
	}
	return NewParkedStore(nil, c.cfg.Schema, c.cfg.ParkedTable).InsertTx(ctx, tx, ps)
}

// parkedRow is the row of one message the batch parks. A message with an
// unusable key is parked under the consumer's scope, without a key.
func (c *Consumer) parkedRow(r parkRow) ParkedRow {
	m, k := r.it.m, r.it.key
	p := ParkedRow{
		Consumer: c.cfg.Name, Scope: c.cfg.Scope, HasMarker: r.hasMarker,
		Source: m.Source, Lane: m.Lane, Ref: m.Ref, MsgKey: m.Key, Payload: m.Value, Headers: m.Headers, MessageTime: m.Time,
		Attempts: r.it.attempt(), Reason: r.reason, ParkCount: 1,
	}
	if r.it.keyErr == nil {
		p.Scope = k.Scope
		p.DedupeID, p.Sender = textOrNil(k.ID, true), textOrNil(k.Sender, true)
		if k.Seq != 0 {
			seq := k.Seq
			p.Seq = &seq
		}
		p.Fingerprint = k.Fingerprint
	}
	if r.err != nil {
		p.LastError = r.err.Error()
	}
	return p
}
