package highwater

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
)

// group is the keys of one (scope, sender) in a batch that the cache could
// not answer.
type group struct {
	scope, sender, key string
	c                  cached
	idx                []int // indexes into keys, in batch order

	inserted bool   // its row was missing and was inserted by this claim
	found    bool   // its row was read, under a lock
	mark     int64  // true mark before this claim
	fp       []byte // fingerprint stored with the mark
	res      judgement
}

// Claim decides the verdicts of keys inside tx and moves the marks of the
// senders whose messages are new.
//
// Keys are judged in batch order, per sender, exactly as if they had been
// delivered one by one: a seq at or below the mark is a duplicate (or a
// mismatch, if it is the mark's own seq, or a seq applied earlier in the
// batch, and the fingerprints differ); in strict mode mark+1 is new and
// moves the mark, so 1, 2, 3 in one batch all apply, while a seq past a hole
// is a gap, even if the hole is filled later in the batch (handlers run in
// batch order, so applying it would break the sender's order); in monotonic
// mode every seq above the mark is new. A key repeated in the batch is
// judged like a redelivery: after a new first occurrence it is a duplicate
// (or a mismatch); after a gap it is judged afresh, and may apply if the
// hole was filled in between.
//
// Keys whose seq is at or below the cached mark are answered from the cache.
// The rest cost one round trip, a pgx.Batch of two statements: an INSERT …
// ON CONFLICT DO NOTHING of the marks of the senders the cache does not
// know, as judged from mark 0 (it wins for senders without a row), and a
// SELECT … FOR UPDATE, in a fixed order, of all the batch's senders' rows.
// When a sender that already had a row moves, one UPDATE of all such marks
// follows: at most three statements in two round trips, whatever the batch
// size. A batch answered entirely by the cache runs no statement. A
// concurrent claim of the same sender waits for the row lock (or for the
// conflicting insert) and then sees the committed mark.
//
// A key that CheckKey rejects fails the whole call with its *dedupe.KeyError
// before any statement runs.
func (s *Strategy) Claim(ctx context.Context, tx pgx.Tx, keys []dedupe.Key) ([]dedupe.Verdict, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("highwater: claim: %w", err)
	}
	for _, k := range keys {
		if err := s.CheckKey(k); err != nil {
			return nil, err
		}
	}
	if stuck := s.stuck.overdue(time.Now(), s.cfg.StuckAfter); stuck != nil {
		now := time.Now()
		for i := range stuck {
			logStuck(s.logger(), &stuck[i], now)
		}
	}
	verdicts := make([]dedupe.Verdict, len(keys))
	groups := make(map[string]*group)
	var todo []*group
	hits := 0
	for i, k := range keys {
		sk := senderKey(k)
		g := groups[sk]
		if g == nil {
			g = &group{scope: k.Scope, sender: k.Sender, key: sk, c: s.cache.get(sk)}
			groups[sk] = g
		}
		if v, ok := answerFromCache(g.c, k); ok {
			verdicts[i] = v
			hits++
			continue
		}
		if len(g.idx) == 0 {
			todo = append(todo, g)
		}
		g.idx = append(g.idx, i)
	}
	s.cache.count(hits, len(keys)-hits)
	if len(todo) == 0 {
		return verdicts, nil
	}
	// A sender missing from the cache may have no row yet. Judge its keys
	// as if its mark were 0; lockMarks inserts the resulting mark, and if
	// the insert wins, that judgement stands and no update is needed.
	for _, g := range todo {
		if !g.c.ok {
			g.res = s.decide(g, 0, nil, keys, verdicts)
		}
	}
	if err := s.lockMarks(ctx, tx, todo); err != nil {
		return nil, err
	}

	now := time.Now()
	var up struct {
		scopes, senders []string
		seqs, olds      []int64
		fps             [][]byte
	}
	for _, g := range todo {
		if !g.inserted {
			g.res = s.decide(g, g.mark, g.fp, keys, verdicts)
		}
		s.noteGaps(g, now)
		if g.res.cur > g.mark && !g.inserted {
			up.scopes = append(up.scopes, g.scope)
			up.senders = append(up.senders, g.sender)
			up.seqs = append(up.seqs, g.res.cur)
			up.olds = append(up.olds, g.mark)
			up.fps = append(up.fps, nullFP(g.res.curFP))
		}
	}
	if len(up.scopes) == 0 {
		return verdicts, nil
	}
	tag, err := tx.Exec(ctx, s.updateSQL, up.scopes, up.senders, up.seqs, up.fps, up.olds)
	if err != nil {
		return nil, fmt.Errorf("highwater: claim: moving marks: %w", err)
	}
	if n := tag.RowsAffected(); n != int64(len(up.scopes)) {
		// Cannot happen while the rows are locked: someone changed the
		// marks table in this transaction behind the strategy's back.
		return nil, fmt.Errorf("highwater: claim: moved %d of %d marks: the marks changed while locked", n, len(up.scopes))
	}
	return verdicts, nil
}

// nullFP stores an empty fingerprint as NULL.
func nullFP(fp []byte) []byte {
	if len(fp) == 0 {
		return nil
	}
	return fp
}

// answerFromCache returns the verdict of k if the cached mark proves it a
// duplicate (or a mismatch of the mark's own message).
func answerFromCache(c cached, k dedupe.Key) (dedupe.Verdict, bool) {
	switch {
	case !c.ok || k.Seq > c.mark:
		return 0, false
	case k.Seq < c.mark:
		return dedupe.VerdictDuplicate, true
	case c.fpKnown:
		if !dedupe.SameFingerprint(c.fp, k.Fingerprint) {
			return dedupe.VerdictMismatch, true
		}
		return dedupe.VerdictDuplicate, true
	case len(k.Fingerprint) == 0:
		return dedupe.VerdictDuplicate, true
	}
	// The mark's fingerprint is not cached: the database may prove a mismatch.
	return 0, false
}

// lockMarks, in one round trip, inserts the marks of the senders missing
// from the cache (the mark each would have if it had none, judged by
// Claim; a conflict with an existing row leaves that row alone), then locks
// all the groups' rows and reads their marks. A group whose insert won is
// marked inserted: its judgement from mark 0 stands.
func (s *Strategy) lockMarks(ctx context.Context, tx pgx.Tx, groups []*group) error {
	// A fixed lock order keeps concurrent claims from deadlocking each other.
	slices.SortFunc(groups, func(a, b *group) int {
		return cmp.Or(cmp.Compare(a.scope, b.scope), cmp.Compare(a.sender, b.sender))
	})
	scopes := make([]string, len(groups))
	senders := make([]string, len(groups))
	var ins struct {
		scopes, senders []string
		seqs            []int64
		fps             [][]byte
	}
	for i, g := range groups {
		scopes[i], senders[i] = g.scope, g.sender
		if !g.c.ok { // a cached sender has a committed row
			ins.scopes = append(ins.scopes, g.scope)
			ins.senders = append(ins.senders, g.sender)
			ins.seqs = append(ins.seqs, g.res.cur)
			ins.fps = append(ins.fps, nullFP(g.res.curFP))
		}
	}
	byKey := make(map[string]*group, len(groups))
	for _, g := range groups {
		byKey[g.key] = g
	}
	b := &pgx.Batch{}
	if len(ins.scopes) > 0 {
		b.Queue(s.insertSQL, ins.scopes, ins.senders, ins.seqs, ins.fps)
	}
	b.Queue(s.lockSQL, scopes, senders)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	var (
		scope, sender string
		seq           int64
		fp            []byte
	)
	if len(ins.scopes) > 0 {
		rows, err := br.Query()
		if err != nil {
			return fmt.Errorf("highwater: claim: inserting marks: %w", err)
		}
		for rows.Next() {
			if err := rows.Scan(&scope, &sender); err != nil {
				rows.Close()
				return fmt.Errorf("highwater: claim: inserting marks: %w", err)
			}
			if g := byKey[scope+"\x00"+sender]; g != nil {
				g.inserted = true
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("highwater: claim: inserting marks: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("highwater: claim: locking marks: %w", err)
	}
	for rows.Next() {
		fp = nil
		if err := rows.Scan(&scope, &sender, &seq, &fp); err != nil {
			rows.Close()
			return fmt.Errorf("highwater: claim: reading marks: %w", err)
		}
		if g := byKey[scope+"\x00"+sender]; g != nil {
			g.found, g.mark, g.fp = true, seq, fp
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("highwater: claim: locking marks: %w", err)
	}
	for _, g := range groups {
		switch {
		case g.inserted:
			g.mark, g.fp = 0, nil // the row read back is the one just inserted
		case !g.found:
			// Only a cached sender skips the insert, so its row was
			// deleted by other means: the cache cannot be trusted.
			s.cache.reset()
			return fmt.Errorf("highwater: claim: the mark of %s/%s was deleted from %s; the cache was emptied, retry the batch",
				g.scope, g.sender, s.marks)
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("highwater: claim: %w", err)
	}
	return nil
}

// judgement is the outcome of deciding a group's keys.
type judgement struct {
	cur       int64  // the mark after the keys
	curFP     []byte // the fingerprint of the message at cur
	gaps, far uint64 // keys held back, and those beyond the reorder window
	lowestGap int64  // lowest seq held back
	farGap    int64  // highest seq held back beyond the window
}

// decide sets the verdicts of g's keys, judged from the given mark and its
// fingerprint. It has no other effect, so it may be run again with the
// true mark.
func (s *Strategy) decide(g *group, mark int64, markFP []byte, keys []dedupe.Key, verdicts []dedupe.Verdict) judgement {
	r := judgement{cur: mark, curFP: markFP}
	var applied map[int64]int // seq -> index of the key that applied it in this batch
	for _, i := range g.idx {
		k := keys[i]
		switch {
		case k.Seq <= r.cur && k.Seq > mark:
			// Applied earlier in this batch: compare with that message. (In
			// monotonic mode a seq skipped over is simply a duplicate.)
			verdicts[i] = dedupe.VerdictDuplicate
			if j, ok := applied[k.Seq]; ok && !dedupe.SameFingerprint(keys[j].Fingerprint, k.Fingerprint) {
				verdicts[i] = dedupe.VerdictMismatch
			}
		case k.Seq <= r.cur:
			verdicts[i] = dedupe.VerdictDuplicate
			if k.Seq == mark && !dedupe.SameFingerprint(markFP, k.Fingerprint) {
				verdicts[i] = dedupe.VerdictMismatch
			}
		case s.cfg.Mode == Monotonic || k.Seq == r.cur+1:
			verdicts[i] = dedupe.VerdictNew
			r.cur, r.curFP = k.Seq, k.Fingerprint
			if len(g.idx) > 1 {
				if applied == nil {
					applied = make(map[int64]int)
				}
				applied[k.Seq] = i
			}
		default:
			verdicts[i] = dedupe.VerdictGap
			r.gaps++
			if r.lowestGap == 0 || k.Seq < r.lowestGap {
				r.lowestGap = k.Seq
			}
			if k.Seq-r.cur-1 > s.cfg.ReorderWindow {
				r.far++
				r.farGap = max(r.farGap, k.Seq)
			}
		}
	}
	return r
}

// noteGaps counts and logs the gaps of g's final judgement, and tracks the
// sender as stuck.
func (s *Strategy) noteGaps(g *group, now time.Time) {
	r := g.res
	if r.gaps == 0 {
		return
	}
	s.gaps.Add(r.gaps)
	if r.far > 0 {
		s.farGaps.Add(r.far)
		s.logger().Warn("highwater: sequence number far ahead of the sender's mark; holding it back as a gap",
			slog.String("scope", g.scope), slog.String("sender", g.sender),
			slog.Int64("mark", r.cur), slog.Int64("seq", r.farGap), slog.Int64("reorder_window", s.cfg.ReorderWindow))
	}
	if w := s.stuck.held(g.scope, g.sender, g.key, r.cur, r.lowestGap, now, s.cfg.StuckAfter); w != nil {
		logStuck(s.logger(), w, now)
	}
}
