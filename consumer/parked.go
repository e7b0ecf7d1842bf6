package consumer

import (
	"context"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/jackc/pgx/v5"
)

// Parked returns the store of the consumer's parked table, to list, count,
// purge or inspect what it parked.
func (c *Consumer) Parked() *parked.Store {
	return parked.NewStore(c.db, c.cfg.Schema, c.cfg.ParkedTable)
}

// parkRow is one message to park.
type parkRow struct {
	it        *item
	reason    string
	err       error
	hasMarker bool
}

// insertParked writes rows in the batch's transaction; see
// parked.Store.InsertTx.
func (c *Consumer) insertParked(ctx context.Context, tx pgx.Tx, rows []parkRow) error {
	if len(rows) == 0 {
		return nil
	}
	ps := make([]parked.Row, len(rows))
	for i, r := range rows {
		ps[i] = c.parkedRow(r)
	}
	return parked.NewStore(nil, c.cfg.Schema, c.cfg.ParkedTable).InsertTx(ctx, tx, ps)
}

// parkedRow is the row of one message the batch parks. A message with an
// unusable key is parked under the consumer's scope, without a key.
func (c *Consumer) parkedRow(r parkRow) parked.Row {
	m, k := r.it.m, r.it.key
	p := parked.Row{
		Consumer: c.cfg.Name, Scope: c.cfg.Scope, HasMarker: r.hasMarker,
		Source: m.Source, Lane: m.Lane, Ref: m.Ref, MsgKey: m.Key, Payload: m.Value, Headers: parkedHeaders(m.Headers), MessageTime: m.Time,
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

func textOrNil(s string, ok bool) *string {
	if !ok || s == "" {
		return nil
	}
	return &s
}

// parkedHeaders are hs as a parked row holds them: nil stays nil, and
// every value is kept as it is, nil or empty.
func parkedHeaders(hs []Header) []parked.Header {
	if hs == nil {
		return nil
	}
	out := make([]parked.Header, len(hs))
	for i, h := range hs {
		out[i] = parked.Header(h)
	}
	return out
}

// parkedMessage rebuilds a parked message as a delivery, as a redrive hands
// it to the handler: Attempt is Attempts+1, and ID and DedupeKey are the
// parked key when there is one.
func parkedMessage(p *parked.Row) *Message {
	var hs []Header
	if p.Headers != nil {
		hs = make([]Header, len(p.Headers))
		for i, h := range p.Headers {
			hs[i] = Header(h)
		}
	}
	m := &Message{
		Key: p.MsgKey, Value: p.Payload, Headers: hs, Time: p.MessageTime,
		Source: p.Source, Lane: p.Lane, Ref: p.Ref, Attempt: p.Attempts + 1,
	}
	if k, ok := p.DedupeKey(); ok {
		m.ID, m.DedupeKey = k.ID, k
	}
	return m
}
