// Package merge sends fewer statements for what a consumer.QueueHandler
// queued, without changing what they do.
//
// Merging single-row INSERTs: the commonest queued statement writes one
// row: INSERT INTO t (a, b) VALUES ($1, $2). Sent once per message, each
// costs PostgreSQL a statement of its own (bind, executor start and end),
// which the same rows written by one statement do not. So a run of such
// statements, with the same text and no callback, queued one after the
// other (by consecutive messages, or by one message), is sent as one
// multi-row INSERT: the same rows, in the same order, at the same point of
// the batch. Should a merged statement fail, no message can be blamed: the
// pass ends (ErrMerged) and the next one sends every statement as queued,
// which blames the right message.
//
// Combining: statements whose only argument is a consumer.Combiner, with
// no callback and the same text, are sent as the one statement that the
// first one's Combine returns for all of them (see Combining). A combined
// statement that fails ends the pass in the same way.
package merge

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// ErrMerged ends a pass in which a merged INSERT, or a statement that
// combines several Combiners', failed.
var ErrMerged = errors.New("a merged INSERT or combined statement failed")

// maxParams is the most parameters one statement may have.
const maxParams = 65535

// maxMergedRows bounds the rows of one merged INSERT. Merged statements
// have 1, 2, 4, … rows up to it, so that a statement's text takes a few
// forms only, each prepared once per connection.
const maxMergedRows = 512

// insertRow matches a single-row INSERT whose values are its parameters
// in order: INSERT INTO t (a, b) VALUES ($1, $2).
var insertRow = regexp.MustCompile(`(?is)^\s*(insert\s+into\s+[^;]+?\)\s*values)\s*\(\s*(\$\d+(?:\s*,\s*\$\d+)*)\s*\)\s*;?\s*$`)

// rowInsert is what merging knows of a statement's text.
type rowInsert struct {
	prefix string // INSERT INTO t (a, b) VALUES
	params int    // 0: not a single-row INSERT of its parameters

	mu    sync.Mutex
	forms map[int]string // rows → merged text
}

// Merger merges runs of statements, caching what it learned of statement
// texts. The zero value is ready to use, and a Merger is safe for
// concurrent use.
type Merger struct {
	mu    sync.Mutex
	texts map[string]*rowInsert
}

// maxTexts bounds the texts a Merger remembers (handlers that build their
// SQL as they go would otherwise grow it without end).
const maxTexts = 1024

func (mg *Merger) lookup(sql string) *rowInsert {
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if ri, ok := mg.texts[sql]; ok {
		return ri
	}
	if mg.texts == nil || len(mg.texts) >= maxTexts {
		mg.texts = map[string]*rowInsert{}
	}
	ri := parseRowInsert(sql)
	mg.texts[sql] = ri
	return ri
}

func parseRowInsert(sql string) *rowInsert {
	m := insertRow.FindStringSubmatch(sql)
	if m == nil {
		return &rowInsert{}
	}
	upper := strings.ToUpper(m[1])
	if strings.Contains(upper, "SELECT") || strings.Contains(upper, "$") || strings.Contains(m[1], "--") || strings.Contains(m[1], "/*") {
		return &rowInsert{} // not a plain table and column list
	}
	for i, p := range strings.Split(m[2], ",") {
		if strings.TrimSpace(p) != "$"+strconv.Itoa(i+1) {
			return &rowInsert{}
		}
		if i+1 > maxParams/2 {
			return &rowInsert{}
		}
	}
	return &rowInsert{prefix: m[1], params: strings.Count(m[2], ",") + 1}
}

// form returns the text of the INSERT of rows rows.
func (ri *rowInsert) form(rows int) string {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	if s, ok := ri.forms[rows]; ok {
		return s
	}
	var b strings.Builder
	b.WriteString(ri.prefix)
	b.WriteByte(' ')
	n := 1
	for r := range rows {
		if r > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('(')
		for c := range ri.params {
			if c > 0 {
				b.WriteByte(',')
			}
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			n++
		}
		b.WriteByte(')')
	}
	if ri.forms == nil {
		ri.forms = map[int]string{}
	}
	s := b.String()
	ri.forms[rows] = s
	return s
}

// mergeable reports whether qq can go in a merged INSERT, and how.
func (mg *Merger) mergeable(qq *pgx.QueuedQuery) *rowInsert {
	if qq.Fn != nil || len(qq.Arguments) == 0 {
		return nil
	}
	if _, ok := qq.Arguments[0].(pgx.QueryRewriter); ok {
		return nil // named arguments and the like
	}
	ri := mg.lookup(qq.SQL)
	if ri.params != len(qq.Arguments) {
		return nil
	}
	return ri
}

// Combining tells the statements that combine and combines them: those
// whose only argument is a consumer.Combiner, which this package cannot
// name.
type Combining interface {
	// Combinable reports whether qq can be combined with the statements of
	// its text.
	Combinable(qq *pgx.QueuedQuery) bool
	// Combine returns the one statement that stands for run (statements
	// that can be combined, of one text), or nil when they cannot be
	// combined.
	Combine(run []*pgx.QueuedQuery) *pgx.QueuedQuery
}

// Merge returns the batch to send for queued, with runs of statements of
// a Combiner of the same text combined (as c tells) and, with inserts,
// runs of mergeable statements of the same text merged, and for each
// statement sent, the first of queued it stands for (the last stands for
// the rest).
func (mg *Merger) Merge(queued []*pgx.QueuedQuery, inserts bool, c Combining) ([]*pgx.QueuedQuery, []int) {
	sent := make([]*pgx.QueuedQuery, 0, len(queued))
	from := make([]int, 0, len(queued))
	for i := 0; i < len(queued); {
		if c.Combinable(queued[i]) {
			j := i + 1
			for j < len(queued) && queued[j].SQL == queued[i].SQL && c.Combinable(queued[j]) {
				j++
			}
			if j-i >= 2 {
				if qq := c.Combine(queued[i:j]); qq != nil {
					sent, from = append(sent, qq), append(from, i)
					i = j
					continue
				}
			}
			for ; i < j; i++ {
				sent, from = append(sent, queued[i]), append(from, i)
			}
			continue
		}
		var ri *rowInsert
		if inserts {
			ri = mg.mergeable(queued[i])
		}
		j := i + 1
		if ri != nil {
			for j < len(queued) && queued[j].SQL == queued[i].SQL && mg.mergeable(queued[j]) == ri {
				j++
			}
		}
		if j-i < 2 {
			sent, from = append(sent, queued[i]), append(from, i)
			i++
			continue
		}
		most := min(maxMergedRows, maxParams/ri.params)
		for i < j {
			rows := 1
			for rows*2 <= min(j-i, most) {
				rows *= 2
			}
			if rows == 1 {
				sent, from = append(sent, queued[i]), append(from, i)
				i++
				continue
			}
			args := make([]any, 0, rows*ri.params)
			for _, qq := range queued[i : i+rows] {
				args = append(args, qq.Arguments...)
			}
			sent, from = append(sent, &pgx.QueuedQuery{SQL: ri.form(rows), Arguments: args}), append(from, i)
			i += rows
		}
	}
	return sent, from
}
