package pgerr

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Kind is what an error means for the work that met it: whether the same
// work, sent again, can succeed.
type Kind uint8

const (
	// Lost: no reply from the server, or the server ended the session
	// (CommitUnknown). Before COMMIT the transaction rolled back; at COMMIT
	// it may have committed.
	Lost Kind = iota + 1
	// Passing: the server could not take the work now (Transient,
	// Unavailable, or it ended a session idle in its transaction for too
	// long: IdleTxTimeout, which rolled the work back), or two of the caller's own claims raced on one of its
	// own tables; the same work may succeed later.
	Passing
	// Refused: the server refused what the work wrote (Refused), on a table
	// that is not the caller's own: the same work is refused again.
	Refused
	// Failed: any other error (a missing table, a permission, a statement
	// the server cannot run): retrying the same work is not known to help.
	Failed
)

// Table names one of the caller's own tables, as PostgreSQL reports it in
// an error's schema and table fields.
type Table struct{ Schema, Name string }

// Classify says what err means. own lists the tables the caller's own
// statements write (markers, stored responses): a constraint violation on
// one of them is a race between two of the caller's claims, which passes,
// never a refusal of the work's content. A violation on any other table,
// or raised by a trigger (which names no table of the caller's), is
// Refused: the SQLSTATE alone does not tell a lost race from a request
// that can never succeed.
func Classify(err error, own ...Table) Kind {
	if CommitUnknown(err) {
		return Lost
	}
	var pe *pgconn.PgError
	errors.As(err, &pe) // CommitUnknown is true for any error without one
	switch {
	case Transient(pe.Code) || Unavailable(pe.Code) || IdleTxTimeout(err):
		return Passing
	case RefusedCode(pe.Code):
		for _, t := range own {
			if pe.TableName == t.Name && pe.SchemaName == t.Schema && pe.TableName != "" {
				return Passing
			}
		}
		return Refused
	}
	return Failed
}

// RefusedCode reports SQLSTATEs by which the server refuses what a
// transaction wrote, at the statement or at COMMIT (a deferred constraint,
// a constraint trigger): an integrity constraint violation (class 23:
// unique, exclusion, foreign key, check, not null, restrict), a value the
// column or function cannot take (class 22, data exception), a trigger's
// RAISE EXCEPTION (P0001) or failed ASSERT (P0004), and a triggered data
// change violation (27000).
func RefusedCode(code string) bool {
	switch code {
	case "P0001", "P0004", "27000":
		return true
	}
	return strings.HasPrefix(code, "23") || strings.HasPrefix(code, "22")
}

// Describe returns the constraint, table and code of err for a log line,
// or only its code when the server named neither.
func Describe(err error) []any {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return nil
	}
	out := []any{"sqlstate", pe.Code}
	if pe.ConstraintName != "" {
		out = append(out, "constraint", pe.ConstraintName)
	}
	if pe.TableName != "" {
		out = append(out, "table", pe.SchemaName+"."+pe.TableName)
	}
	return out
}
