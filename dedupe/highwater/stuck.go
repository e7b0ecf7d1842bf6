package highwater

import (
	"cmp"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// StuckSender is a sender whose messages are held back behind a missing
// sequence number (strict mode).
type StuckSender struct {
	Scope, Sender string
	// Mark is the sender's mark when a message was last held back.
	Mark int64
	// LowestHeld is the lowest sequence number held back; the messages
	// from Mark+1 to LowestHeld-1 have not arrived.
	LowestHeld int64
	// Since is when the sender first got stuck behind this hole.
	Since time.Time
}

// stuckSet tracks, in memory, the senders that returned a gap and have not
// moved past it yet.
type stuckSet struct {
	mu       sync.Mutex
	senders  map[string]*stuckEntry
	lastScan time.Time
}

type stuckEntry struct {
	StuckSender
	warned time.Time
}

// held records that a claim held back seqs of a sender, the lowest being
// lowest, while its mark was mark. It returns the entry to warn about when
// the sender has been stuck for longer than after and was not warned about
// in the last after.
func (s *stuckSet) held(scope, sender string, key string, mark, lowest int64, now time.Time, after time.Duration) (warn *StuckSender) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.senders == nil {
		s.senders = make(map[string]*stuckEntry)
	}
	e, ok := s.senders[key]
	if !ok || mark >= e.LowestHeld-1 {
		// A new hole, or the old one filled and another opened.
		e = &stuckEntry{StuckSender: StuckSender{Scope: scope, Sender: sender, LowestHeld: lowest, Since: now}}
		s.senders[key] = e
	}
	e.Mark = max(e.Mark, mark)
	e.LowestHeld = min(e.LowestHeld, lowest)
	if now.Sub(e.Since) >= after && now.Sub(e.warned) >= after {
		e.warned = now
		w := e.StuckSender
		return &w
	}
	return nil
}

// overdue returns the senders stuck for longer than after that were not
// warned about in the last after. It scans at most once per after/4, so
// that senders whose held messages are no longer delivered (parked, say)
// are still reported.
func (s *stuckSet) overdue(now time.Time, after time.Duration) []StuckSender {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.senders) == 0 || now.Sub(s.lastScan) < after/4 {
		return nil
	}
	s.lastScan = now
	var out []StuckSender
	for _, e := range s.senders {
		if now.Sub(e.Since) >= after && now.Sub(e.warned) >= after {
			e.warned = now
			out = append(out, e.StuckSender)
		}
	}
	return out
}

// progressed records that a sender's mark reached at least mark, and forgets
// the sender if that fills its hole.
func (s *stuckSet) progressed(key string, mark int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.senders[key]; ok && mark >= e.LowestHeld-1 {
		delete(s.senders, key)
	}
}

func (s *stuckSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.senders)
}

func (s *stuckSet) list() []StuckSender {
	s.mu.Lock()
	out := make([]StuckSender, 0, len(s.senders))
	for _, e := range s.senders {
		out = append(out, e.StuckSender)
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b StuckSender) int {
		return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Sender, b.Sender))
	})
	return out
}

func logStuck(l *slog.Logger, w *StuckSender, now time.Time) {
	l.Warn("highwater: sender stuck behind a missing sequence number",
		slog.String("scope", w.Scope), slog.String("sender", w.Sender),
		slog.Int64("mark", w.Mark), slog.Int64("lowest_held", w.LowestHeld),
		slog.Int64("missing_from", w.Mark+1), slog.Int64("missing_to", w.LowestHeld-1),
		slog.Duration("stuck_for", now.Sub(w.Since).Round(time.Millisecond)))
}
