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

	found bool
	mark  int64  // true mark, read under a row lock
	fp    []byte // fingerprint stored with the mark
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
// The rest cost one round trip (a pgx.Batch that creates missing mark rows
// and locks the senders' rows, FOR UPDATE, in a fixed order) plus, when
// anything is new, one UPDATE of all advanced marks: two round trips and at
// most three statements, whatever the batch size. A batch answered entirely
// by the cache runs no statement. A concurrent claim of the same sender
// waits for the row lock, and then sees the committed mark.
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
		cur, curFP := s.decide(g, keys, verdicts, now)
		if cur > g.mark {
			up.scopes = append(up.scopes, g.scope)
			up.senders = append(up.senders, g.sender)
			up.seqs = append(up.seqs, cur)
			up.olds = append(up.olds, g.mark)
			if len(curFP) == 0 {
				curFP = nil // stored as NULL
			}
			up.fps = append(up.fps, curFP)
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

// lockMarks creates the missing mark rows of groups, locks all their rows and
// reads their marks, in one round trip.
func (s *Strategy) lockMarks(ctx context.Context, tx pgx.Tx, groups []*group) error {
	// A fixed lock order keeps concurrent claims from deadlocking each other.
	slices.SortFunc(groups, func(a, b *group) int {
		return cmp.Or(cmp.Compare(a.scope, b.scope), cmp.Compare(a.sender, b.sender))
	})
	scopes := make([]string, len(groups))
	senders := make([]string, len(groups))
	var newScopes, newSenders []string
	for i, g := range groups {
		scopes[i], senders[i] = g.scope, g.sender
		if !g.c.ok { // a cached sender has a committed row
			newScopes = append(newScopes, g.scope)
			newSenders = append(newSenders, g.sender)
		}
	}
	b := &pgx.Batch{}
	if len(newScopes) > 0 {
		b.Queue(s.ensureSQL, newScopes, newSenders)
	}
	b.Queue(s.lockSQL, scopes, senders)
	br := tx.SendBatch(ctx, b)
	defer br.Close()
	if len(newScopes) > 0 {
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("highwater: claim: creating marks: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return fmt.Errorf("highwater: claim: locking marks: %w", err)
	}
	byKey := make(map[string]*group, len(groups))
	for _, g := range groups {
		byKey[g.key] = g
	}
	var (
		scope, sender string
		seq           int64
		fp            []byte
	)
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
		if !g.found {
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

// decide sets the verdicts of g's keys from its true mark and returns the
// mark after them, with the fingerprint of the message at that seq.
func (s *Strategy) decide(g *group, keys []dedupe.Key, verdicts []dedupe.Verdict, now time.Time) (cur int64, curFP []byte) {
	cur, curFP = g.mark, g.fp
	var applied map[int64]int // seq -> index of the key that applied it in this batch
	var lowestGap, farGap int64
	var gaps, far uint64
	for _, i := range g.idx {
		k := keys[i]
		if k.Seq <= cur && k.Seq > g.mark {
			// Applied earlier in this batch: compare with that message. (In
			// monotonic mode a seq skipped over is simply a duplicate.)
			verdicts[i] = dedupe.VerdictDuplicate
			if j, ok := applied[k.Seq]; ok && !dedupe.SameFingerprint(keys[j].Fingerprint, k.Fingerprint) {
				verdicts[i] = dedupe.VerdictMismatch
			}
			continue
		}
		switch {
		case k.Seq <= cur:
			verdicts[i] = dedupe.VerdictDuplicate
			if k.Seq == g.mark && !dedupe.SameFingerprint(g.fp, k.Fingerprint) {
				verdicts[i] = dedupe.VerdictMismatch
			}
		case s.cfg.Mode == Monotonic || k.Seq == cur+1:
			verdicts[i] = dedupe.VerdictNew
			cur, curFP = k.Seq, k.Fingerprint
			if len(g.idx) > 1 {
				if applied == nil {
					applied = make(map[int64]int)
				}
				applied[k.Seq] = i
			}
		default:
			verdicts[i] = dedupe.VerdictGap
			gaps++
			if lowestGap == 0 || k.Seq < lowestGap {
				lowestGap = k.Seq
			}
			if k.Seq-cur-1 > s.cfg.ReorderWindow {
				far++
				farGap = max(farGap, k.Seq)
			}
		}
	}
	if gaps == 0 {
		return cur, curFP
	}
	s.gaps.Add(gaps)
	if far > 0 {
		s.farGaps.Add(far)
		s.logger().Warn("highwater: sequence number far ahead of the sender's mark; holding it back as a gap",
			slog.String("scope", g.scope), slog.String("sender", g.sender),
			slog.Int64("mark", cur), slog.Int64("seq", farGap), slog.Int64("reorder_window", s.cfg.ReorderWindow))
	}
	if w := s.stuck.held(g.scope, g.sender, g.key, cur, lowestGap, now, s.cfg.StuckAfter); w != nil {
		logStuck(s.logger(), w, now)
	}
	return cur, curFP
}
