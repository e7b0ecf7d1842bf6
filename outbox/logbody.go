package outbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// A LogMode Emit writes one row to the log table holding all its messages
// in one body, so that an emit costs one heap row whatever its size. The
// body is a version byte, the message count, and per message: partition,
// sink, key, ID, value and headers (as encodeHeaders makes them), each a
// uvarint length and its bytes; a key, value or headers that may be nil
// is written with its length plus one, 0 meaning nil.
const logBodyVersion = 1

// maxLogEmit is the most messages one LogMode Emit takes: a message's
// place in its emit is part of the ID the log relay gives it (logRowID).
const maxLogEmit = 1 << 20

// logRowID is the ID a log relay gives the i-th message of the emit row
// id: negative, so that it never meets a messages-table row's ID.
func logRowID(id int64, i int) int64 { return -(id<<20 | int64(i)) }

// encodeLogBody encodes rs as a log table row's body.
func encodeLogBody(rs *emitRows) []byte {
	n := len(rs.ids)
	size := 8
	for i := range n {
		size += 24 + len(rs.sinks[i]) + len(rs.keys[i]) + len(rs.ids[i]) + len(rs.values[i]) + len(rs.headers[i])
	}
	b := make([]byte, 0, size)
	b = append(b, logBodyVersion)
	b = binary.AppendUvarint(b, uint64(n))
	str := func(s []byte) { b = binary.AppendUvarint(b, uint64(len(s))); b = append(b, s...) }
	opt := func(s []byte) {
		if s == nil {
			b = append(b, 0)
			return
		}
		b = binary.AppendUvarint(b, uint64(len(s))+1)
		b = append(b, s...)
	}
	for i := range n {
		b = binary.AppendUvarint(b, uint64(rs.parts[i]))
		str([]byte(rs.sinks[i]))
		opt(rs.keys[i])
		str([]byte(rs.ids[i]))
		opt(rs.values[i])
		opt(rs.headers[i])
	}
	return b
}

var errLogBody = errors.New("outbox: corrupt log row body")

// decodeLogBody decodes the body of the log table row id, committed (or
// written) at created, into rows with IDs from logRowID.
func decodeLogBody(id int64, created time.Time, b []byte) ([]row, error) {
	if len(b) == 0 || b[0] != logBodyVersion {
		return nil, fmt.Errorf("outbox: log row %d: body version %v unknown", id, b[:min(len(b), 1)])
	}
	b = b[1:]
	uv := func() (uint64, bool) {
		v, k := binary.Uvarint(b)
		if k <= 0 {
			return 0, false
		}
		b = b[k:]
		return v, true
	}
	take := func(n uint64) ([]byte, bool) {
		if uint64(len(b)) < n {
			return nil, false
		}
		s := b[:n:n]
		b = b[n:]
		return s, true
	}
	str := func() ([]byte, bool) {
		n, ok := uv()
		if !ok {
			return nil, false
		}
		return take(n)
	}
	opt := func() ([]byte, bool) {
		n, ok := uv()
		if !ok || n == 0 {
			return nil, ok
		}
		return take(n - 1)
	}
	count, ok := uv()
	if !ok || count > maxLogEmit {
		return nil, fmt.Errorf("%w (row %d)", errLogBody, id)
	}
	rows := make([]row, count)
	for i := range rows {
		x := &rows[i]
		part, ok1 := uv()
		sink, ok2 := str()
		key, ok3 := opt()
		msgID, ok4 := str()
		value, ok5 := opt()
		headers, ok6 := opt()
		if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) || part >= Partitions {
			return nil, fmt.Errorf("%w (row %d, message %d)", errLogBody, id, i)
		}
		x.id, x.part, x.created = logRowID(id, i), int32(part), created
		x.msg = Message{Sink: string(sink), Key: key, ID: string(msgID), Value: value}
		var err error
		if x.msg.Headers, err = decodeHeaders(headers); err != nil {
			return nil, fmt.Errorf("outbox: log row %d, message %d: %w", id, i, err)
		}
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w (row %d: %d bytes left over)", errLogBody, id, len(b))
	}
	return rows, nil
}
