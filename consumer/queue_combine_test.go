package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/consumer/internal/merge"
	"github.com/jackc/pgx/v5"
)

// rowsArg is a Combiner that writes its values with one INSERT of an
// array, alone or joined with others.
type rowsArg struct {
	vals []int
	fail bool // Combine refuses
}

func (a *rowsArg) RewriteQuery(_ context.Context, _ *pgx.Conn, sql string, _ []any) (string, []any, error) {
	return sql, []any{a.vals}, nil
}

func (a *rowsArg) Combine(all []Combiner) (string, []any, error) {
	var vals []int
	for _, c := range all {
		x := c.(*rowsArg)
		if x.fail {
			return "", nil, errors.New("cannot")
		}
		vals = append(vals, x.vals...)
	}
	return "combined", []any{vals}, nil
}

var _ Combiner = (*rowsArg)(nil)

// The statements of a Combiner move after the others, grouped by text in
// order of first appearance, and each group is sent as one statement; the
// others keep their order, INSERTs merged as before. Without a merger
// (the passes that find the message to blame) nothing moves.
func TestCombineRuns(t *testing.T) {
	t.Parallel()
	comb := func(sql string, v ...int) *pgx.QueuedQuery {
		return &pgx.QueuedQuery{SQL: sql, Arguments: []any{&rowsArg{vals: v}}}
	}
	ins := func(i int) *pgx.QueuedQuery {
		return &pgx.QueuedQuery{SQL: `INSERT INTO t (a) VALUES ($1)`, Arguments: []any{i}}
	}
	withFn := comb("E", 100)
	withFn.Exec(nil) // a callback: sent as queued, in place
	queued := []*pgx.QueuedQuery{ins(0), comb("E", 1), ins(1), comb("F", 9), comb("E", 2, 3), withFn, ins(2), comb("E", 4)}
	owner := []int{0, 0, 1, 1, 2, 3, 3, 4}
	combineLast(queued, owner)
	var order []string
	for i, qq := range queued {
		order = append(order, fmt.Sprintf("%d:%s", owner[i], qq.SQL))
	}
	if got, want := strings.Join(order, " "), "0:INSERT INTO t (a) VALUES ($1) 1:INSERT INTO t (a) VALUES ($1) 3:E 3:INSERT INTO t (a) VALUES ($1) 0:E 2:E 4:E 1:F"; got != want {
		t.Fatalf("order\n%s\nwant\n%s", got, want)
	}
	var mg merge.Merger
	sent, from := mg.Merge(queued, true, combining{})
	var got []string
	for i, qq := range sent {
		arg := fmt.Sprint(qq.Arguments)
		if a, ok := qq.Arguments[0].(*rowsArg); ok {
			arg = fmt.Sprint("rows", a.vals)
		}
		got = append(got, fmt.Sprintf("%d:%s:%s", from[i], qq.SQL, arg))
	}
	want := []string{
		"0:INSERT INTO t (a) VALUES ($1),($2):[0 1]",
		"2:E:rows[100]",
		"3:INSERT INTO t (a) VALUES ($1):[2]",
		"4:combined:[[1 2 3 4]]",
		"7:F:rows[9]",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("sent:\n%v\nwant\n%v", got, want)
	}

	// Inserts not merged (Config.NoInsertMerge): Combiners still combine.
	sent, _ = mg.Merge(queued, false, combining{})
	if len(sent) != 6 || sent[4].SQL != "combined" {
		t.Errorf("without insert merging: %d statements sent, the fifth %q", len(sent), sent[4].SQL)
	}

	// A Combine that fails leaves its statements as queued.
	bad := []*pgx.QueuedQuery{comb("E", 1), {SQL: "E", Arguments: []any{&rowsArg{vals: []int{2}, fail: true}}}}
	if sent, _ := mg.Merge(bad, true, combining{}); len(sent) != 2 || sent[0] != bad[0] || sent[1] != bad[1] {
		t.Errorf("a refused Combine: sent %v", sent)
	}
}
