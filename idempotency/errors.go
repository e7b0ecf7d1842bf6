package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/internal/pgerr"
)

// Failures are classified by pgerr.Classify, the rule the consumer uses:
// by what failed and where, not by the SQLSTATE alone.
//
//   - The middleware's own statements (BEGIN, the lock, the claim, storing
//     or loading a response) write only its own tables: a unique violation
//     there is a race between two claims of the key, which passes. With
//     every other passing failure (a lost connection, a serialization
//     failure, a server shutting down) it answers 503 with Retry-After.
//     Any other failure of its own is the service's fault: 500, logged.
//   - The handler's writes (its statements, and the deferred constraints
//     and constraint triggers checked at COMMIT): a refusal (a unique,
//     exclusion, foreign key, check or not-null violation, a trigger's
//     RAISE, a data exception) is the request's fault and is refused again
//     however often it is sent: 422, no Retry-After, nothing stored, so the
//     client can fix the request and send it with the same key. A passing
//     failure is 503 with Retry-After; anything else 500.
//
// Nothing is stored in any of these cases.

// ownFailure answers a failure of the middleware's own statements.
func (m *Middleware) ownFailure(w http.ResponseWriter, k dedupe.Key, step string, err error) (consumer.Outcome, error) {
	err = fmt.Errorf("idempotency: %s: %w", step, err)
	kind := pgerr.Classify(err)
	var pe *pgconn.PgError
	if kind == pgerr.Refused && errors.As(err, &pe) && pe.Code == "23505" {
		kind = pgerr.Passing // a race between two claims on the middleware's tables
	}
	if kind == pgerr.Lost || kind == pgerr.Passing {
		m.unavailable(w)
		return consumer.OutcomeRetried, err
	}
	m.log.Error("idempotency: database failure; the client gets 500 and nothing was done",
		append([]any{"step", step, "scope", k.Scope, "key_hash", keyHash(k), "err", err}, pgerr.Describe(err)...)...)
	m.problem(w, http.StatusInternalServerError, "Internal error", "A database failure; nothing was done.")
	return consumer.OutcomeRetried, err
}

// writeFailure answers a failure of the handler's writes, met by one of its
// statements or at COMMIT. Nothing was stored.
func (m *Middleware) writeFailure(w http.ResponseWriter, k dedupe.Key, err error) (consumer.Outcome, error) {
	err = fmt.Errorf("idempotency: the handler's writes failed: %w", err)
	switch pgerr.Classify(err, m.own) {
	case pgerr.Lost, pgerr.Passing:
		m.unavailable(w)
	case pgerr.Refused:
		m.log.Warn("idempotency: the database refused the handler's writes; the client gets 422 and nothing was done",
			append([]any{"scope", k.Scope, "key_hash", keyHash(k), "err", err}, pgerr.Describe(err)...)...)
		m.problem(w, http.StatusUnprocessableEntity, "Request refused by the database",
			"The request's writes break "+rule(err)+"; nothing was done, and the same request would be refused again. Change the request; the idempotency key may be used again.")
	default:
		m.log.Error("idempotency: the handler's writes failed; the client gets 500 and nothing was done",
			append([]any{"scope", k.Scope, "key_hash", keyHash(k), "err", err}, pgerr.Describe(err)...)...)
		m.problem(w, http.StatusInternalServerError, "Internal error", "The database refused the request's writes; nothing was done.")
	}
	return consumer.OutcomeRetried, err
}

// unavailable answers 503 with Retry-After: nothing was done, and the same
// request may succeed later.
func (m *Middleware) unavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", m.retry)
	m.problem(w, http.StatusServiceUnavailable, "Service unavailable", "A transient database failure; nothing was done. Retry with the same key.")
}

// rule names, for a client, the kind of rule a refused write broke, without
// the names of the service's tables and constraints (they are logged).
func rule(err error) string {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return "a rule of the database"
	}
	switch pe.Code {
	case "23505":
		return "a uniqueness rule"
	case "23P01":
		return "an exclusion rule (an overlap)"
	case "23503":
		return "a reference rule (a referenced record is missing, or still referenced)"
	case "23514":
		return "a check rule"
	case "23502":
		return "a required-value rule"
	case "P0001", "P0004", "27000":
		return "a business rule"
	}
	if pe.Code[:2] == "22" {
		return "a value rule (a value out of range or malformed)"
	}
	return "an integrity rule"
}

// keyHash is what logs show of a key: the first 12 hex digits of the
// SHA-256 of its scope and ID. A key is a bearer of its stored response,
// and logs are read by more people than the database is.
func keyHash(k dedupe.Key) string {
	h := sha256.New()
	h.Write([]byte(k.Scope))
	h.Write([]byte{0})
	h.Write([]byte(k.ID))
	return hex.EncodeToString(h.Sum(nil)[:6])
}
