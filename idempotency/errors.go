package idempotency

import (
	"errors"
	"strings"

	"github.com/effectively-once/effectively/internal/pgerr"
	"github.com/jackc/pgx/v5/pgconn"
)

// transient reports whether a failure of the middleware's own statements
// (BEGIN, the lock, the claim, storing or loading a response) passes by
// itself: no reply from the server, the server ending the session, a
// SQLSTATE the consumer also retries (pgerr.Transient, pgerr.Unavailable),
// an operator's intervention (57), or a unique-violation race with another
// claim. The client gets 503 with Retry-After; nothing was stored.
func transient(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Severity == "FATAL" || pe.Severity == "PANIC" {
		return true
	}
	return pgerr.Transient(pe.Code) || pgerr.Unavailable(pe.Code) ||
		pe.Code == "23505" || strings.HasPrefix(pe.Code, "57")
}

// commitOutcome is what a failed COMMIT means.
type commitOutcome uint8

const (
	// commitRolledBack: the server answered the COMMIT with an error, so the
	// transaction rolled back (a transient reason, or a deferred constraint
	// of the handler's writes).
	commitRolledBack commitOutcome = iota + 1
	// commitUnknown: the connection was lost while the COMMIT or its answer
	// was on its way: it may have committed.
	commitUnknown
)

// classifyCommit decides what a COMMIT's error means, by the rule the
// consumer uses (pgerr.CommitUnknown), and whether a rolled-back COMMIT is
// worth retrying.
func classifyCommit(err error) (commitOutcome, bool) {
	if pgerr.CommitUnknown(err) {
		return commitUnknown, true
	}
	return commitRolledBack, transient(err)
}
