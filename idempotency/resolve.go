package idempotency

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe"
)

// resolveTimeout bounds how long finding out a lost COMMIT's outcome may
// take, waiting for the lost session to end included.
const resolveTimeout = 10 * time.Second

// resolve answers a request whose COMMIT lost its connection: it finds out,
// on another connection, whether the transaction committed, and answers as
// if the reply had arrived.
//
// The stored response is written in the request's transaction, so it
// exists exactly when the transaction committed. The lost session holds the
// key's lock until the server has committed or rolled it back, so waiting
// for the lock first makes the answer final: committed (the handler's
// response, as a first response, reported applied), rolled back (503 with
// Retry-After: nothing was done), or, when another request for the key
// committed in between, that one's stored response, replayed. Only when
// the database cannot be asked (no other connection, a db that is one
// connection) is the outcome left unknown: 503 with Retry-After, and the
// retry gets the stored response if there is one.
func (m *Middleware) resolve(ctx context.Context, w http.ResponseWriter, k dedupe.Key, resp stored, header http.Header, commitErr error) (consumer.Outcome, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	got, ok, err := m.afterLock(ctx, k)
	switch {
	case err != nil:
		m.log.Warn("idempotency: connection lost during COMMIT and the outcome could not be found out; the client gets 503 and its retry gets the stored response if it committed",
			"scope", k.Scope, "key_hash", keyHash(k), "err", commitErr, "check_err", err)
		w.Header().Set("Retry-After", m.retry)
		m.problem(w, http.StatusServiceUnavailable, "Outcome unknown", "The database connection was lost while committing; retry with the same key to get the outcome.")
		return consumer.OutcomeUnknown, fmt.Errorf("idempotency: commit outcome unknown: %w (checking: %v)", commitErr, err)
	case !ok:
		m.unavailable(w)
		return consumer.OutcomeRetried, fmt.Errorf("idempotency: connection lost during COMMIT, which did not commit: %w", commitErr)
	case got.status == resp.status && bytes.Equal(got.body, resp.body) && bytes.Equal(got.fingerprint, resp.fingerprint):
		if m.commit != nil {
			m.commit.Committed([]dedupe.Key{k}, []dedupe.Verdict{dedupe.VerdictNew})
		}
		send(w, header, resp.status, resp.body)
		return consumer.OutcomeApplied, nil
	default:
		// This transaction rolled back, and a retry's committed since.
		m.committedDuplicate(k)
		sendReplay(w, got)
		return consumer.OutcomeDuplicate, nil
	}
}

// afterLock waits for the key's lock in a transaction of its own, then
// returns the key's stored response.
func (m *Middleware) afterLock(ctx context.Context, k dedupe.Key) (stored, bool, error) {
	tx, err := m.db.Begin(ctx)
	if err != nil {
		return stored{}, false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read only
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, lockKey(k.Scope, k.ID)); err != nil {
		return stored{}, false, err
	}
	return m.store.load(ctx, tx, k.Scope, k.ID)
}
