package merge

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Only single-row INSERTs of their parameters in order are merged.
func TestParseRowInsert(t *testing.T) {
	t.Parallel()
	for sql, params := range map[string]int{
		`INSERT INTO ledger (a, b, c) VALUES ($1, $2, $3)`:            3,
		"insert into s.t(a) values($1);":                              1,
		"INSERT INTO \"odd (name)\" (a, b)\n\tVALUES\n($1,$2)":        2,
		`INSERT INTO t (a, b) VALUES ($2, $1)`:                        0,
		`INSERT INTO t (a, b) VALUES ($1, now())`:                     0,
		`INSERT INTO t (a, b) VALUES ($1, $2) ON CONFLICT DO NOTHING`: 0,
		`INSERT INTO t (a, b) VALUES ($1, $2) RETURNING a`:            0,
		`INSERT INTO t VALUES ($1, $2)`:                               0,
		`INSERT INTO t (a) SELECT x FROM u WHERE y IN ($1)`:           0,
		`INSERT INTO t (a) VALUES ($1), ($2)`:                         0,
		`UPDATE t SET a = $1`:                                         0,
		`INSERT INTO t (a) /* c */ VALUES ($1)`:                       0,
	} {
		if got := parseRowInsert(sql).params; got != params {
			t.Errorf("%q: %d parameters to merge, want %d", sql, got, params)
		}
	}
}

// Runs of the same single-row INSERT merge, in order, in chunks of powers
// of two; anything else is sent as queued.
func TestMergeRuns(t *testing.T) {
	t.Parallel()
	ins := func(i int) *pgx.QueuedQuery {
		return &pgx.QueuedQuery{SQL: `INSERT INTO t (a, b) VALUES ($1, $2)`, Arguments: []any{i, -i}}
	}
	other := &pgx.QueuedQuery{SQL: `UPDATE u SET n = n + 1`}
	withFn := ins(99)
	withFn.Exec(nil)
	var queued []*pgx.QueuedQuery
	for i := range 7 {
		queued = append(queued, ins(i))
	}
	queued = append(queued, other, ins(7), withFn, ins(8), ins(9))
	var mg Merger
	sent, from := mg.Merge(queued, true, noCombining{})
	var got []string
	for i, qq := range sent {
		got = append(got, fmt.Sprintf("%d:%s:%v", from[i], qq.SQL, qq.Arguments))
	}
	want := []string{
		"0:INSERT INTO t (a, b) VALUES ($1,$2),($3,$4),($5,$6),($7,$8):[0 0 1 -1 2 -2 3 -3]",
		"4:INSERT INTO t (a, b) VALUES ($1,$2),($3,$4):[4 -4 5 -5]",
		"6:INSERT INTO t (a, b) VALUES ($1, $2):[6 -6]",
		"7:UPDATE u SET n = n + 1:[]",
		"8:INSERT INTO t (a, b) VALUES ($1, $2):[7 -7]",
		"9:INSERT INTO t (a, b) VALUES ($1, $2):[99 -99]",
		"10:INSERT INTO t (a, b) VALUES ($1,$2),($3,$4):[8 -8 9 -9]",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("merged:\n%v\nwant\n%v", got, want)
	}
}

// noCombining combines nothing.
type noCombining struct{}

func (noCombining) Combinable(*pgx.QueuedQuery) bool            { return false }
func (noCombining) Combine([]*pgx.QueuedQuery) *pgx.QueuedQuery { return nil }
