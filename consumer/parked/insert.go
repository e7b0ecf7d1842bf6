package parked

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// parkCols is one row of the parked insert.
type parkCols struct {
	hash                             []byte
	count                            int32
	consumer                         string
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

// colsOf renders r for the insert: source, lane and ref as readable text
// with their exact bytes beside, headers as JSON, the error cleaned to text.
func colsOf(r *Row) *parkCols {
	p := &parkCols{
		count: int32(max(r.ParkCount, 1)), consumer: r.Consumer, scope: r.Scope,
		dedupeID: r.DedupeID, sender: r.Sender, seq: r.Seq, fp: r.Fingerprint,
		hasKey: r.HasKey(), hasMarker: r.HasMarker,
		attempts: int32(r.Attempts), reason: r.Reason, lastErr: cleanText(r.LastError),
	}
	p.hash = messageHash(r)
	p.source, _ = renderText(r.Source)
	p.lane, _ = renderText(r.Lane)
	p.ref, _ = renderText(r.Ref)
	p.sourceBytes, p.laneBytes, p.refBytes = bytesIfInexact(r.Source), bytesIfInexact(r.Lane), []byte(r.Ref)
	// Nil stays nil (NULL) and empty stays empty: a Kafka tombstone is
	// not an empty message.
	p.key, p.payload = r.MsgKey, r.Payload
	p.headers = encodeHeaders(r.Headers)
	if !r.MessageTime.IsZero() {
		t := r.MessageTime
		p.messageTime = &t
	}
	return p
}

// InsertTx parks rows in tx, in one statement. No row is dropped or merged
// with another message: rows of the same message (same scope, source, ref,
// key, payload and headers; the same delivery twice in rows, or a message
// parked before) are folded into one row that counts them in ParkCount,
// keeps the most attempts, the newest reason and error, and the newest key
// when the newer parking has one; a marker written with the row stands for
// as long as the row keeps the key it was written for. They are folded
// first here, since one statement cannot update a row twice, then by the
// statement's ON CONFLICT clause. New rows take ids in the order of rows,
// which is the order Redrive takes them.
func (s *Store) InsertTx(ctx context.Context, tx pgx.Tx, rows []Row) error {
	if len(rows) == 0 {
		return nil
	}
	byHash := make(map[string]*parkCols, len(rows))
	ps := make([]*parkCols, 0, len(rows))
	for i := range rows {
		p := colsOf(&rows[i])
		if q, ok := byHash[string(p.hash)]; ok {
			q.merge(p)
			continue
		}
		byHash[string(p.hash)] = p
		ps = append(ps, p)
	}
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
		consumers[i], scopes[i], ids[i], senders[i], seqs[i], fps[i], markers[i] = p.consumer, p.scope, p.dedupeID, p.sender, p.seq, p.fp, p.hasMarker
		sources[i], lanes[i], refs[i], keys[i], payloads[i], headers[i], times[i] = p.source, p.lane, p.ref, p.key, p.payload, p.headers, p.messageTime
		attempts[i], reasons[i], lastErrs[i] = p.attempts, p.reason, p.lastErr
		hashes[i], counts[i], refBytes[i], srcBytes[i], laneBytes[i] = p.hash, p.count, p.refBytes, p.sourceBytes, p.laneBytes
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+s.ident+` AS p (consumer, scope, dedupe_id, sender, seq, fingerprint, has_marker,
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
	if err != nil {
		return fmt.Errorf("inserting into %s: %w", s.ident, err)
	}
	return nil
}
