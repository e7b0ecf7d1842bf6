package outbox

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// logTxn is one committed transaction's outbox rows.
type logTxn struct {
	rows []row
	end  LSN // the transaction's end: confirming it confirms the transaction
	at   time.Time
}

// stream reads the replication stream on conn and hands each committed
// transaction with outbox rows to the publisher, which runs beside it.
// This goroutine owns conn: it also sends the confirmed position every
// StatusInterval and when the server asks. It returns nil when ctx is
// done, after the publisher finished its batch and the position it
// reached was sent.
func (r *LogRelay) stream(ctx context.Context, conn *pgconn.PgConn) error {
	pctx, stopPub := context.WithCancel(ctx)
	txns := make(chan *logTxn, 256)
	var pending atomic.Int64 // transactions handed over and not yet confirmed
	pubDone := make(chan error, 1)
	go func() { pubDone <- r.publishLoop(pctx, txns, &pending) }()
	pubRunning := true
	defer func() {
		stopPub()
		if pubRunning {
			<-pubDone
		}
	}()

	status := func() error {
		lsn := LSN(r.confirmed.Load())
		if lsn == 0 {
			return nil
		}
		return pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: lsn})
	}
	dec := decoder{schema: r.cfg.Schema, table: r.cfg.Table, logNames: r.t.logNames}
	var cur *logTxn
	nextStatus := time.Now().Add(r.cfg.StatusInterval)
	for {
		select {
		case err := <-pubDone:
			pubRunning = false
			if ctx.Err() != nil {
				return r.finalStatus(conn)
			}
			if err == nil {
				err = errors.New("outbox: log relay: publisher stopped")
			}
			return err
		default:
		}
		if ctx.Err() != nil {
			stopPub()
			<-pubDone
			pubRunning = false
			return r.finalStatus(conn)
		}
		if !time.Now().Before(nextStatus) {
			if err := status(); err != nil {
				return fmt.Errorf("outbox: log relay: status update: %w", err)
			}
			nextStatus = time.Now().Add(r.cfg.StatusInterval)
		}
		rctx, cancel := context.WithDeadline(ctx, nextStatus)
		msg, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) || ctx.Err() != nil {
				continue
			}
			return fmt.Errorf("outbox: log relay: receive: %w", err)
		}
		var data []byte
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			data = m.Data
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(m)
		default:
			continue
		}
		if len(data) == 0 {
			continue
		}
		switch data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
			if err != nil {
				return fmt.Errorf("outbox: log relay: %w", err)
			}
			if cur == nil && pending.Load() == 0 {
				// Nothing of the outbox is in flight: the slot may confirm
				// the WAL other tables wrote, so the server need not keep it.
				r.advance(pkm.ServerWALEnd)
			}
			if pkm.ReplyRequested {
				nextStatus = time.Time{}
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(data[1:])
			if err != nil {
				return fmt.Errorf("outbox: log relay: %w", err)
			}
			lm, err := pglogrepl.Parse(xld.WALData)
			if err != nil {
				return fmt.Errorf("outbox: log relay: decode: %w", err)
			}
			switch m := lm.(type) {
			case *pglogrepl.RelationMessage:
				if err := dec.relation(m); err != nil {
					return err
				}
			case *pglogrepl.BeginMessage:
				cur = &logTxn{at: m.CommitTime}
			case *pglogrepl.InsertMessage:
				if cur == nil {
					return errors.New("outbox: log relay: an insert outside a transaction")
				}
				if lc, ok := dec.logRels[m.RelationID]; ok {
					xs, err := lc.rows(m, cur.at)
					if err != nil {
						return err
					}
					cur.rows = append(cur.rows, xs...)
					continue
				}
				x, ok, err := dec.insert(m)
				if err != nil {
					return err
				}
				if ok {
					x.created = cur.at
					cur.rows = append(cur.rows, x)
				}
			case *pglogrepl.CommitMessage:
				if cur == nil {
					continue
				}
				cur.end = m.TransactionEndLSN
				t := cur
				cur = nil
				if len(t.rows) == 0 {
					if pending.Load() == 0 {
						r.advance(t.end)
					}
					continue
				}
				pending.Add(1)
				r.mu.Lock()
				r.waiting = append(r.waiting, pendingCommit{end: t.end, at: t.at})
				r.mu.Unlock()
				if err := r.handOver(ctx, conn, txns, t, &nextStatus, status); err != nil {
					return err
				}
			}
		}
	}
}

// handOver gives t to the publisher, keeping the status updates going
// while it is busy (the server ends a stream that stays silent past
// wal_sender_timeout).
func (r *LogRelay) handOver(ctx context.Context, conn *pgconn.PgConn, txns chan<- *logTxn, t *logTxn, next *time.Time, status func() error) error {
	for {
		timer := time.NewTimer(max(time.Until(*next), 0))
		select {
		case txns <- t:
			timer.Stop()
			return nil
		case <-ctx.Done():
			timer.Stop()
			return nil // the loop sees ctx and stops
		case <-timer.C:
			if err := status(); err != nil {
				return fmt.Errorf("outbox: log relay: status update: %w", err)
			}
			*next = time.Now().Add(r.cfg.StatusInterval)
		}
	}
}

// finalStatus tells the server the position reached, at shutdown.
func (r *LogRelay) finalStatus(conn *pgconn.PgConn) error {
	lsn := LSN(r.confirmed.Load())
	if lsn == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: lsn}); err != nil {
		r.log.Warn("outbox: log relay: last status update failed; the next reader starts from the position sent before (messages after it are published again)", "err", err)
	}
	return nil
}

// decoder turns pgoutput's insert messages of the outbox table, and of the
// log table, into rows.
type decoder struct {
	schema, table string
	logNames      [3]string // the log table and its halves
	rel           uint32    // the outbox's relation ID, once announced
	cols          struct{ id, part, sink, key, seq, msgID, value, headers, lastError int }
	logRels       map[uint32]logCols // the log table's relations (its halves, or itself via the root)
}

// logCols are the columns of a log table relation.
type logCols struct{ id, body int }

// rows decodes one inserted log row into its messages.
func (c logCols) rows(m *pglogrepl.InsertMessage, at time.Time) ([]row, error) {
	cols := m.Tuple.Columns
	if len(cols) <= max(c.id, c.body) {
		return nil, errors.New("outbox: log relay: a log row with too few columns")
	}
	id, err := intCol(cols[c.id])
	if err != nil {
		return nil, fmt.Errorf("outbox: log relay: log column id: %w", err)
	}
	body, err := byteaCol(cols[c.body])
	if err != nil {
		return nil, fmt.Errorf("outbox: log relay: log column body: %w", err)
	}
	return decodeLogBody(id, at, body)
}

func (d *decoder) relation(m *pglogrepl.RelationMessage) error {
	if m.Namespace != d.schema {
		return nil
	}
	if m.RelationName == d.logNames[0] || m.RelationName == d.logNames[1] || m.RelationName == d.logNames[2] {
		c := logCols{id: -1, body: -1}
		for i, col := range m.Columns {
			switch col.Name {
			case "id":
				c.id = i
			case "body":
				c.body = i
			}
		}
		if c.id < 0 || c.body < 0 {
			return fmt.Errorf("outbox: log relay: the log table %s has no id or body column", m.RelationName)
		}
		if d.logRels == nil {
			d.logRels = map[uint32]logCols{}
		}
		d.logRels[m.RelationID] = c
		return nil
	}
	if m.RelationName != d.table {
		return nil
	}
	idx := map[string]int{}
	for i, c := range m.Columns {
		idx[c.Name] = i
	}
	get := func(name string) (int, error) {
		i, ok := idx[name]
		if !ok {
			return 0, fmt.Errorf("outbox: log relay: the outbox table has no column %q", name)
		}
		return i, nil
	}
	var err error
	for _, f := range []struct {
		p    *int
		name string
	}{{&d.cols.id, "id"}, {&d.cols.part, "part"}, {&d.cols.sink, "sink"}, {&d.cols.key, "key"}, {&d.cols.seq, "seq"},
		{&d.cols.msgID, "msg_id"}, {&d.cols.value, "value"}, {&d.cols.headers, "headers"}, {&d.cols.lastError, "last_error"}} {
		if *f.p, err = get(f.name); err != nil {
			return err
		}
	}
	d.rel = m.RelationID
	return nil
}

// insert decodes one inserted row; ok is false for another table's, and
// for a parked row.
func (d *decoder) insert(m *pglogrepl.InsertMessage) (x row, ok bool, err error) {
	if d.rel == 0 || m.RelationID != d.rel {
		return row{}, false, nil
	}
	cols := m.Tuple.Columns
	if len(cols) <= max(d.cols.id, d.cols.part, d.cols.sink, d.cols.key, d.cols.seq, d.cols.msgID, d.cols.value, d.cols.headers, d.cols.lastError) {
		return row{}, false, errors.New("outbox: log relay: an insert with too few columns")
	}
	if cols[d.cols.lastError].DataType != pglogrepl.TupleDataTypeNull {
		// A parked row, written by a log relay for a message of the log
		// table it parked: not a message emitted.
		return row{}, false, nil
	}
	fail := func(col string, err error) (row, bool, error) {
		return row{}, false, fmt.Errorf("outbox: log relay: column %s: %w", col, err)
	}
	if x.id, err = intCol(cols[d.cols.id]); err != nil {
		return fail("id", err)
	}
	part, err := intCol(cols[d.cols.part])
	if err != nil {
		return fail("part", err)
	}
	x.part = int32(part)
	if x.seq, err = intCol(cols[d.cols.seq]); err != nil {
		return fail("seq", err)
	}
	x.msg.Sink = string(cols[d.cols.sink].Data)
	x.msg.ID = string(cols[d.cols.msgID].Data)
	if x.msg.Key, err = byteaCol(cols[d.cols.key]); err != nil {
		return fail("key", err)
	}
	if x.msg.Value, err = byteaCol(cols[d.cols.value]); err != nil {
		return fail("value", err)
	}
	h, err := byteaCol(cols[d.cols.headers])
	if err != nil {
		return fail("headers", err)
	}
	if x.msg.Headers, err = decodeHeaders(h); err != nil {
		return fail("headers", err)
	}
	return x, true, nil
}

// intCol decodes an integer column, binary (int4, int8) or text.
func intCol(c *pglogrepl.TupleDataColumn) (int64, error) {
	switch c.DataType {
	case pglogrepl.TupleDataTypeBinary:
		switch len(c.Data) {
		case 4:
			return int64(int32(binary.BigEndian.Uint32(c.Data))), nil
		case 8:
			return int64(binary.BigEndian.Uint64(c.Data)), nil
		}
		return 0, fmt.Errorf("an integer of %d bytes", len(c.Data))
	case pglogrepl.TupleDataTypeText:
		return strconv.ParseInt(string(c.Data), 10, 64)
	}
	return 0, fmt.Errorf("unexpected %q", c.DataType)
}

// byteaCol decodes a bytea column: nil for NULL, binary or text (hex).
func byteaCol(c *pglogrepl.TupleDataColumn) ([]byte, error) {
	switch c.DataType {
	case pglogrepl.TupleDataTypeNull:
		return nil, nil
	case pglogrepl.TupleDataTypeBinary:
		if c.Data == nil {
			return []byte{}, nil
		}
		return c.Data, nil
	case pglogrepl.TupleDataTypeText:
		if len(c.Data) < 2 || c.Data[0] != '\\' || c.Data[1] != 'x' {
			return nil, errors.New("bytea text not in hex format")
		}
		out := make([]byte, hex.DecodedLen(len(c.Data)-2))
		_, err := hex.Decode(out, c.Data[2:])
		return out, err
	}
	return nil, fmt.Errorf("unexpected %q", c.DataType)
}
