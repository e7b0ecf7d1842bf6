// Package pgerr decides what a PostgreSQL error means for the work that
// met it, for every part of the library that runs its own transactions
// (the consumer, the Idempotency-Key middleware): whether a failed COMMIT
// may have committed, which SQLSTATEs pass by themselves, and, by which
// table a violated constraint is on, whether the work's content was
// refused (Classify).
package pgerr

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// CommitUnknown reports whether a failed COMMIT may have committed. An
// error reply means the transaction rolled back; a lost connection (no
// reply at all, or the server ending the session: terminated, shutting
// down, crashed) leaves the outcome open. pgconn.SafeToRetry is no proof
// that the COMMIT did not reach the server: a reply lost after the server
// committed surfaces as "conn closed", which claims to be safe to retry.
//
// One FATAL error is an answer: idle_in_transaction_session_timeout
// (IdleTxTimeout) ended the session while its transaction sat idle, waiting
// for the client's next command. The server checks for that timeout after
// reading a command and before running it, so a COMMIT answered by it was
// never run: the transaction rolled back. That is what a client stalled
// before or while sending COMMIT (a stopped process, a long pause) reads
// when it wakes.
func CommitUnknown(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return true
	}
	if IdleTxTimeout(err) {
		return false
	}
	return pe.Severity == "FATAL" || pe.Severity == "PANIC" ||
		strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P")
}

// IdleTxTimeout reports whether err is the server ending the session
// because its transaction sat idle for longer than
// idle_in_transaction_session_timeout (SQLSTATE 25P03): the transaction
// rolled back.
func IdleTxTimeout(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "25P03"
}

// Transient reports SQLSTATEs that fail a transaction through no fault of
// its content. At COMMIT, a query_canceled (57014) is a cancel request:
// PostgreSQL stops the statement_timeout clock before COMMIT runs the
// deferred triggers, so it is never that timeout.
func Transient(code string) bool {
	switch code {
	case "40001", // serialization_failure
		"40P01", // deadlock_detected
		"55P03", // lock_not_available
		"57014": // query_canceled: a cancel request
		return true
	}
	switch code[:min(2, len(code))] {
	case "53", // insufficient resources
		"58", // system error (I/O)
		"XX": // internal error
		return true
	}
	return false
}

// Unavailable reports SQLSTATEs that say the database as a whole cannot
// take work now, as during a primary switch.
func Unavailable(code string) bool {
	switch code {
	case "25006", // read_only_sql_transaction: a standby, or a primary made read-only
		"57P01", // admin_shutdown
		"57P02", // crash_shutdown
		"57P03", // cannot_connect_now: the database system is starting up
		"53300", // too_many_connections
		"53100": // disk_full
		return true
	}
	return strings.HasPrefix(code, "08") // connection_exception
}
