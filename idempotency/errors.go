package idempotency

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// transient reports whether a failure of the middleware's own statements
// (BEGIN, the lock, the claim, storing or loading a response) passes by
// itself: a serialization failure, a deadlock, a lock or statement
// cancelled, a unique-violation race, a connection lost or refused, the
// server short of resources or shutting down. The client gets 503 with
// Retry-After; nothing was stored.
func transient(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		// No reply from the server: a connection lost, refused or timed out.
		return true
	}
	switch pe.Code {
	case "40001", // serialization_failure
		"40P01", // deadlock_detected
		"55P03", // lock_not_available
		"57014", // query_canceled
		"23505", // unique_violation: a race with another claim
		"25006": // read_only_sql_transaction: a standby, or a failover under way
		return true
	}
	if pe.Severity == "FATAL" || pe.Severity == "PANIC" {
		return true
	}
	switch pe.Code[:min(2, len(pe.Code))] {
	case "08", // connection exception
		"53", // insufficient resources
		"57", // operator intervention (shutdown, crash, cannot connect now)
		"58": // system error
		return true
	}
	return false
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

// classifyCommit is the one place that decides what a COMMIT's error means
// (the consumer decides the same way).
func classifyCommit(err error) (commitOutcome, bool) {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return commitUnknown, true
	}
	if pe.Severity == "FATAL" || pe.Severity == "PANIC" ||
		strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P") {
		return commitUnknown, true
	}
	return commitRolledBack, transient(err)
}
