package consumer

import (
	"github.com/effectively-once/effectively/consumer/internal/merge"
	"github.com/jackc/pgx/v5"
)

// Combiner, as the only argument of a statement a QueueHandler queues,
// lets the consumer send that statement and the like statements of the
// batch's other messages as one. The statements of a round (what the
// handlers queued, or what their callbacks queued) whose only argument is
// a Combiner, with no callback set and the same text, are sent as the one
// statement that the first one's Combine returns for all of them, after
// the round's other statements, in the same round trip. outbox.EmitQueued
// so writes a batch's messages with one INSERT.
//
// Each of those statements must also run alone, as queued: the consumer
// sends them so when it looks for the message to blame for a failure
// (should a combined statement fail, the pass ends and the next one sends
// every statement as queued), and a pgx.Batch does. So a Combiner is a
// pgx.QueryRewriter, which gives the statement's arguments.
//
// Since a combined statement runs after the round's other statements, a
// Combiner's statement must be one that the batch's other statements do
// not read the effect of, such as rows written for readers after the
// commit.
type Combiner interface {
	pgx.QueryRewriter
	// Combine returns the statement that does what the statements whose
	// arguments are all do, in that order. The receiver is all[0]; every
	// one has the receiver's statement text. An error leaves them sent one
	// by one.
	Combine(all []Combiner) (sql string, args []any, err error)
}

// combinerOf returns the Combiner of a statement that can be combined.
func combinerOf(qq *pgx.QueuedQuery) Combiner {
	if qq.Fn != nil || len(qq.Arguments) != 1 {
		return nil
	}
	c, _ := qq.Arguments[0].(Combiner)
	return c
}

// combineLast moves the statements that can be combined after the others,
// grouped by text in the order each text first appears, keeping the order
// within each group and among the others; owner moves with them. Nothing
// moves when there is none.
func combineLast(qs []*pgx.QueuedQuery, owner []int) {
	first := -1
	for i, qq := range qs {
		if combinerOf(qq) != nil {
			first = i
			break
		}
	}
	if first < 0 {
		return
	}
	var texts []string
	groups := map[string][]int{}
	rest := make([]int, 0, len(qs)-first)
	for i := first; i < len(qs); i++ {
		if combinerOf(qs[i]) == nil {
			rest = append(rest, i)
			continue
		}
		sql := qs[i].SQL
		if _, ok := groups[sql]; !ok {
			texts = append(texts, sql)
		}
		groups[sql] = append(groups[sql], i)
	}
	for _, sql := range texts {
		rest = append(rest, groups[sql]...)
	}
	oldQ := append([]*pgx.QueuedQuery(nil), qs[first:]...)
	oldO := append([]int(nil), owner[first:]...)
	for k, i := range rest {
		qs[first+k], owner[first+k] = oldQ[i-first], oldO[i-first]
	}
}

// combine returns the one statement that stands for run (statements that
// can be combined, of one text), or nil when they cannot be combined.
func combine(run []*pgx.QueuedQuery) *pgx.QueuedQuery {
	cs := make([]Combiner, len(run))
	for i, qq := range run {
		cs[i] = combinerOf(qq)
	}
	sql, args, err := cs[0].Combine(cs)
	if err != nil {
		return nil
	}
	return &pgx.QueuedQuery{SQL: sql, Arguments: args}
}

// combining is how merge.Merger tells and combines the statements of a
// Combiner.
type combining struct{}

var _ merge.Combining = combining{}

func (combining) Combinable(qq *pgx.QueuedQuery) bool { return combinerOf(qq) != nil }

func (combining) Combine(run []*pgx.QueuedQuery) *pgx.QueuedQuery { return combine(run) }
