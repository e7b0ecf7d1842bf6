package highwater

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/effectively-once/effectively/dedupe"
	"github.com/jackc/pgx/v5"
)

// ErrBackwards is matched by the error Advance returns when the mark is
// already past the requested seq.
var ErrBackwards = errors.New("highwater: a mark never moves backwards")

// Advance moves the mark of (scope, sender) forward to seq `to`, inside tx,
// so that the sender's held messages after a hole that will never be filled
// can apply; the messages in between are given up on. It records the move,
// with reason, in the advances table, in the same transaction, and returns
// the mark it moved from. The fingerprint of the new mark is unknown (NULL).
//
// It refuses, with an error matching ErrBackwards, to move a mark backwards;
// a mark already at `to` is left alone, with no audit row, and from == to.
// A sender without a mark starts from 0. Nothing else ever moves a mark
// past a hole.
//
// The cache is left as is (it may only lag behind the true mark), and the
// sender leaves Stuck when `to` reaches its hole's end.
func (s *Strategy) Advance(ctx context.Context, tx pgx.Tx, scope, sender string, to int64, reason string) (from int64, err error) {
	k := dedupe.Key{Scope: scope, Sender: sender, Seq: to}
	if err := s.CheckKey(k); err != nil {
		return 0, fmt.Errorf("highwater: advance: %w", err)
	}
	if strings.TrimSpace(reason) == "" {
		return 0, errors.New("highwater: advance: a reason is required; it is kept in the audit table")
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.marks+` (scope, sender, seq) VALUES ($1, $2, 0)
ON CONFLICT (scope, sender) DO NOTHING`, scope, sender); err != nil {
		return 0, fmt.Errorf("highwater: advance: %w", err)
	}
	if err := tx.QueryRow(ctx, `SELECT seq FROM `+s.marks+` WHERE scope = $1 AND sender = $2 FOR UPDATE`,
		scope, sender).Scan(&from); err != nil {
		return 0, fmt.Errorf("highwater: advance: %w", err)
	}
	switch {
	case to < from:
		return from, fmt.Errorf("%w: the mark of %s/%s is %d, refusing to move it back to %d", ErrBackwards, scope, sender, from, to)
	case to == from:
		return from, nil
	}
	b := &pgx.Batch{}
	b.Queue(`UPDATE `+s.marks+` SET seq = $3, fingerprint = NULL, updated_at = now() WHERE scope = $1 AND sender = $2`,
		scope, sender, to)
	b.Queue(`INSERT INTO `+s.advances+` (scope, sender, from_seq, to_seq, reason) VALUES ($1, $2, $3, $4, $5)`,
		scope, sender, from, to, reason)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return from, fmt.Errorf("highwater: advance: %w", err)
	}
	s.stuck.progressed(senderKey(k), to)
	return from, nil
}
