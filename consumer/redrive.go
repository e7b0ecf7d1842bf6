package consumer

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
)

// RedriveFilter selects parked messages of one scope. The zero value selects
// all of them.
type RedriveFilter struct {
	// IDs, when not empty, limits the redrive to these parked-row ids.
	IDs []int64
	// Refs, when not empty, limits the redrive to rows whose Message.Ref
	// is one of these, byte for byte. Several rows may share a ref (other
	// messages delivered under it).
	Refs []string
	// Reason, when set, limits the redrive to rows parked for this reason
	// (ReasonPermanent, ReasonMaxAttempts, …).
	Reason string
	// Limit is the most rows redriven. Defaults to 0: no limit.
	Limit int
}

// Redrive outcomes, in RedriveItem.Outcome.
const (
	// RedriveApplied: the handler ran; its effect and the removal of the
	// parked row committed together.
	RedriveApplied = "applied"
	// RedriveDuplicate: the message's key was claimed by another delivery
	// since it was parked; the parked row was removed and nothing ran.
	RedriveDuplicate = "duplicate"
	// RedriveFailed: the handler (or the claim) failed; the row stays
	// parked, with attempts and last_error updated.
	RedriveFailed = "failed"
	// RedriveSkipped: the row cannot be redriven as it is (no key and no
	// KeyFunc, a key reused with another payload, a sequence gap); it stays
	// parked.
	RedriveSkipped = "skipped"
	// RedriveGone: the row was removed (redriven or purged) by someone else
	// between selection and redrive.
	RedriveGone = "gone"
)

// RedriveItem is what became of one parked row.
type RedriveItem struct {
	ID  int64
	Ref string // exact, possibly not valid UTF-8
	// ParkCount is how many times the message was parked before (the same
	// message delivered and parked again shares its row).
	ParkCount int
	Reason    string // the reason it was parked
	Outcome   string // one of the Redrive* outcomes
	Err       error  // why it failed or was skipped
}

// RedriveResult counts the outcomes of a Redrive and lists every row.
type RedriveResult struct {
	Applied, Duplicate, Failed, Skipped, Gone int
	Items                                     []RedriveItem
}

func (r *RedriveResult) add(it RedriveItem) {
	switch it.Outcome {
	case RedriveApplied:
		r.Applied++
	case RedriveDuplicate:
		r.Duplicate++
	case RedriveFailed:
		r.Failed++
	case RedriveSkipped:
		r.Skipped++
	case RedriveGone:
		r.Gone++
	}
	r.Items = append(r.Items, it)
}

// Redrive runs the parked messages of cfg.Scope selected by f through
// cfg's handler again, oldest first, each in a transaction of its own that
// also deletes its parked row: a redriven message is applied exactly once
// and leaves the parked table in the same commit. cfg is the consumer's
// Config (its Name, Scope, Strategy, handler, KeyFunc, key settings, Schema,
// ParkedTable and Logger apply), so a message is keyed, claimed and handled
// on the same path as in the consumer.
//
// The row is deleted first, which locks it: a second Redrive of the same
// row, at the same time, waits and then finds it gone (RedriveGone). A
// message parked without a dedupe marker (invalid_key, gap) has its key
// claimed with cfg.Strategy first (a message parked with reason
// invalid_key gets its key from cfg.KeyFunc, which can be a new one); if
// another delivery applied it meanwhile, its row is removed as a
// duplicate. A handler failure rolls the transaction back: the row stays
// parked, with attempts incremented and last_error set, and Redrive goes
// on with the next row. Each redriven row is logged at Info level.
//
// Redrive is safe while consumers of the same scope run. It returns an
// error only when it cannot go on (the database is unreachable, the table
// missing, ctx done), together with what it did until then.
func Redrive(ctx context.Context, db dedupe.DB, cfg Config, f RedriveFilter) (RedriveResult, error) {
	var res RedriveResult
	if db == nil {
		return res, &ConfigError{Package: "consumer", Field: "db", Reason: "must not be nil"}
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return res, err
	}
	if f.Limit < 0 {
		return res, dedupe.ConfigErrorf("consumer", "RedriveFilter.Limit", "must not be negative, got %d", f.Limit)
	}
	return redrive(ctx, db, newPath(cfg, cfg.Logger, nil), f)
}

// Redrive runs the consumer's parked messages selected by f through its
// handler again; see the function Redrive.
func (c *Consumer) Redrive(ctx context.Context, f RedriveFilter) (RedriveResult, error) {
	if f.Limit < 0 {
		return RedriveResult{}, dedupe.ConfigErrorf("consumer", "RedriveFilter.Limit", "must not be negative, got %d", f.Limit)
	}
	return redrive(ctx, c.db, c.path, f)
}

func redrive(ctx context.Context, db dedupe.DB, p path, f RedriveFilter) (RedriveResult, error) {
	var res RedriveResult
	r := &redriver{db: db, path: p, filter: f, table: pgx.Identifier{p.cfg.Schema, p.cfg.ParkedTable}.Sanitize()}
	ids, err := r.selectIDs(ctx)
	if err != nil {
		return res, err
	}
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		it, err := r.one(ctx, id)
		if err != nil {
			return res, err
		}
		p.log.InfoContext(ctx, "redrive", "id", it.ID, "ref", it.Ref, "park_count", it.ParkCount, "reason", it.Reason, "outcome", it.Outcome, "err", errString(it.Err))
		res.add(it)
	}
	return res, nil
}

type redriver struct {
	db     dedupe.DB
	path   path
	filter RedriveFilter
	table  string
}

func (r *redriver) selectIDs(ctx context.Context) ([]int64, error) {
	f := r.filter
	var limit *int64
	if f.Limit > 0 {
		l := int64(f.Limit)
		limit = &l
	}
	var ids []int64
	if len(f.IDs) > 0 {
		ids = f.IDs
	}
	var refs [][]byte
	for _, r := range f.Refs {
		refs = append(refs, []byte(r))
	}
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("consumer: redrive: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, `SELECT id FROM `+r.table+`
WHERE scope = $1 AND ($2 = '' OR reason = $2) AND ($3::bigint[] IS NULL OR id = ANY($3))
    AND ($5::bytea[] IS NULL OR ref_bytes = ANY($5))
ORDER BY id LIMIT $4`, r.path.cfg.Scope, f.Reason, ids, limit, refs)
	if err != nil {
		return nil, fmt.Errorf("consumer: redrive: selecting parked rows of %s: %w", r.table, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("consumer: redrive: selecting parked rows of %s: %w", r.table, err)
	}
	return out, tx.Commit(ctx)
}

// parkedMsg is a parked row as read back.
type parkedMsg struct {
	id        int64
	key       dedupe.Key
	hasKey    bool
	hasMarker bool
	reason    string
	attempts  int
	parkCount int
	m         *Message
}

// one redrives the row id in a transaction of its own, on the consumer's
// path: the key (derived again if it was parked without one), the claim
// (if it was parked without a marker), the handler.
func (r *redriver) one(ctx context.Context, id int64) (RedriveItem, error) {
	p := &r.path
	it := RedriveItem{ID: id}
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return it, fmt.Errorf("consumer: redrive: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	pm, err := r.take(ctx, tx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		it.Outcome = RedriveGone
		return it, nil
	}
	if err != nil {
		return it, err
	}
	it.Ref, it.Reason, it.ParkCount = pm.m.Ref, pm.reason, pm.parkCount

	if !pm.hasKey {
		k, kerr := p.keys.key(pm.m)
		if kerr != nil {
			it.Outcome, it.Err = RedriveSkipped, fmt.Errorf("the KeyFunc derives no usable key (redrive it with a KeyFunc that does): %w", kerr)
			return it, nil
		}
		pm.key, pm.hasKey = k, true
		pm.m.DedupeKey = k
	}
	var verdict dedupe.Verdict
	if !pm.hasMarker {
		vs, cerr := p.claimKeys(ctx, tx, []dedupe.Key{pm.key})
		var ke *dedupe.KeyError
		switch {
		case errors.As(cerr, &ke):
			it.Outcome, it.Err = RedriveSkipped, ke
			return it, nil
		case cerr != nil:
			return it, fmt.Errorf("consumer: redrive: %w", cerr)
		}
		switch verdict = vs[0]; verdict {
		case dedupe.VerdictDuplicate:
			if err := tx.Commit(ctx); err != nil {
				return it, fmt.Errorf("consumer: redrive: commit: %w", err)
			}
			p.committed([]dedupe.Key{pm.key}, vs)
			it.Outcome = RedriveDuplicate
			return it, nil
		case dedupe.VerdictMismatch:
			it.Outcome, it.Err = RedriveSkipped, fmt.Errorf("key %s was applied before with another payload", pm.key)
			return it, nil
		case dedupe.VerdictGap:
			it.Outcome, it.Err = RedriveSkipped, fmt.Errorf("sequence gap: %s is still ahead of its sender's mark", pm.key)
			return it, nil
		}
	}
	if herr := p.handleOne(ctx, tx, pm.m); herr != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		it.Outcome, it.Err = RedriveFailed, herr
		if err := r.recordFailure(ctx, id, herr); err != nil {
			return it, err
		}
		return it, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return it, fmt.Errorf("consumer: redrive: commit: %w", err)
	}
	if verdict != 0 {
		p.committed([]dedupe.Key{pm.key}, []dedupe.Verdict{verdict})
	}
	it.Outcome = RedriveApplied
	return it, nil
}

// take deletes the parked row id, which locks it until tx ends, and
// rebuilds its message.
func (r *redriver) take(ctx context.Context, tx pgx.Tx, id int64) (*parkedMsg, error) {
	var (
		p                       = &parkedMsg{id: id, m: &Message{}}
		scope, source, lane     string
		ref, sourceRaw, laneRaw []byte
		dedupeID, sender        *string
		seq                     *int64
		fp, key, payload        []byte
		headers                 []byte
		mt                      *time.Time
	)
	err := tx.QueryRow(ctx, `DELETE FROM `+r.table+` WHERE id = $1 AND scope = $2
RETURNING scope, dedupe_id, sender, seq, fingerprint, has_marker, source, source_bytes, lane, lane_bytes, ref_bytes,
    msg_key, payload, headers, message_time, attempts, reason, park_count`, id, r.path.cfg.Scope).Scan(
		&scope, &dedupeID, &sender, &seq, &fp, &p.hasMarker, &source, &sourceRaw, &lane, &laneRaw, &ref,
		&key, &payload, &headers, &mt, &p.attempts, &p.reason, &p.parkCount)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("consumer: redrive: taking parked row %d from %s: %w", id, r.table, err)
	}
	m := p.m
	// A NULL key or payload scans as nil, an empty one as empty: a parked
	// tombstone is redriven as a tombstone.
	m.Key, m.Value, m.Source, m.Lane, m.Ref = key, payload, source, lane, string(ref)
	if sourceRaw != nil {
		m.Source = string(sourceRaw)
	}
	if laneRaw != nil {
		m.Lane = string(laneRaw)
	}
	m.Attempt = p.attempts + 1
	if mt != nil {
		m.Time = *mt
	}
	hs, err := decodeHeaders(headers)
	if err != nil {
		return nil, fmt.Errorf("consumer: redrive: parked row %d: %w", id, err)
	}
	m.Headers = hs
	if dedupeID != nil || sender != nil {
		p.hasKey = true
		p.key = dedupe.Key{Scope: scope, Fingerprint: fp}
		if dedupeID != nil {
			p.key.ID = *dedupeID
			m.ID = *dedupeID
		}
		if sender != nil {
			p.key.Sender = *sender
		}
		if seq != nil {
			p.key.Seq = *seq
		}
		m.DedupeKey = p.key
	}
	return p, nil
}

// decodeHeaders reverses encodeHeaders.
func decodeHeaders(raw []byte) ([]Header, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var js []headerJSON
	if err := json.Unmarshal(raw, &js); err != nil {
		return nil, fmt.Errorf("headers: %w", err)
	}
	if len(js) == 0 {
		return nil, nil
	}
	out := make([]Header, len(js))
	for i, j := range js {
		out[i].Key = j.Key
		if j.KeyBase64 != "" {
			k, err := base64.StdEncoding.DecodeString(j.KeyBase64)
			if err != nil {
				return nil, fmt.Errorf("header %q: key: %w", j.Key, err)
			}
			out[i].Key = string(k)
		}
		switch {
		case j.Null:
			out[i].Value = nil
		case j.ValueBase64 != "":
			v, err := base64.StdEncoding.DecodeString(j.ValueBase64)
			if err != nil {
				return nil, fmt.Errorf("header %q: %w", j.Key, err)
			}
			out[i].Value = v
		default:
			out[i].Value = []byte(j.Value)
		}
	}
	return out, nil
}

// recordFailure notes a failed redrive on the row, which stayed parked.
func (r *redriver) recordFailure(ctx context.Context, id int64, herr error) error {
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("consumer: redrive: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `UPDATE `+r.table+` SET attempts = attempts + 1, last_error = $2 WHERE id = $1`,
		id, cleanText("redrive: "+herr.Error())); err != nil {
		return fmt.Errorf("consumer: redrive: recording failure of parked row %d: %w", id, err)
	}
	return tx.Commit(ctx)
}
