// Package idempotency is net/http middleware for the Idempotency-Key
// header (the IETF httpapi draft, and the behaviour Stripe documents): a
// client that retries a POST after a timeout gets the first response
// again instead of a second effect.
//
// A wrapped request with a key runs in one PostgreSQL transaction. The
// middleware takes a transaction-level advisory lock on (scope, key) and
// reads the key's row in the responses table, which is its claim: a row
// there is a completed key. For a new key it runs the handler with that
// transaction (Tx), then inserts the key's row with the response the
// handler wrote and commits it with the handler's writes. Only then is the
// response sent. One row per key, as a hand-written idempotency-key table
// keeps; Config.Strategy adds a dedupe strategy's marker besides it (for
// an upgrade from a version that claimed keys by markers).
//
//	mw, err := idempotency.New(pool, idempotency.Config{
//		Scope: func(r *http.Request) (string, error) { return accountOf(r), nil },
//	})
//	// mw.Migrate(ctx) once; go mw.Run(ctx) for sweeping and maintenance.
//	http.Handle("POST /payments", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
//		tx := idempotency.Tx(r.Context())
//		// … write through tx, then write the response …
//	})))
//
// # Answers
//
//   - No key on a route that requires one (the default; Config.Optional
//     lets such requests through without a transaction): 400.
//   - A key that is empty, too long (Config.MaxKeyLen), not printable
//     ASCII, or sent twice: 400. The key may be bare or a quoted
//     Structured Field string.
//   - A body over Config.MaxRequestBytes: 413. A JSON body (by its
//     Content-Type) that is not valid JSON: 400. Nothing is stored.
//   - The key's first request still running (the lock is held and no
//     response is stored): 409 with Retry-After. A completed key whose lock
//     is held (by a concurrent retry) is replayed, without waiting.
//   - The key already used with another fingerprint: 422.
//   - The key already used with the same fingerprint: the stored status,
//     headers (Content-Type, Location and Config.Headers) and body, byte
//     for byte, with Idempotent-Replayed: true.
//   - A new key: the handler's response, after the commit. The first
//     response carries every header the handler set; replays carry the
//     stored ones.
//   - The handler's writes refused by the database, at a statement or at
//     COMMIT (a unique, exclusion, foreign key, check or not-null
//     violation, a trigger's RAISE, a data exception), whether the handler
//     noticed or not: 422 without Retry-After, nothing stored, so the
//     client can fix the request and reuse the key.
//   - A transient database failure (serialization failure, deadlock, a
//     race between two claims on the middleware's tables, connection lost
//     before COMMIT, server shutting down): 503 with Retry-After. Nothing
//     was stored.
//   - A COMMIT whose connection was lost: its outcome is found out on
//     another connection once the lost session's lock is free: the
//     handler's response if it committed, 503 with Retry-After if not, and
//     503 (reported unknown) only when the database cannot be asked.
//
// # What is stored when
//
// A response is final, and stored with the handler's writes, when its
// status is below 400, or when the handler called Final on the request's
// context (an error that is the outcome of the effect, such as a declined
// payment that was recorded). Any other 4xx or 5xx rolls the transaction
// back: no key row, no response, no writes, so the client can fix the
// request and retry with the same key. A handler that panics, a request
// whose context is cancelled mid-handler, a response over
// Config.MaxResponseBytes (500, logged) and a process that dies mid-request
// all roll back the same way.
//
// The fingerprint (see Fingerprint) covers the method, path, query and
// body; a JSON body counts in canonical form (dedupe.CanonicalJSON), so
// {"amount":500,"to":"acct_9"} and { "to": "acct_9", "amount": 500 } are
// the same request and a changed amount is not.
//
// Keys are scoped: Config.Name, then the principal Config.Scope returns,
// so one caller's key never meets another's. Scope is required (New
// refuses a Config without it) unless SingleTenant declares a service with
// one caller. Credential headers cannot be stored for replay, and logs
// name a key by a short hash (key_hash), never in clear.
//
// # Operations
//
// Migrations returns the responses table's migration line (after the
// strategy's, with a Config.Strategy) for pg.Migrate or the CLI's
// migrate; Migrate applies them. Run sweeps responses older than
// Config.Retention (7 days and an hour by default; after it a key is new
// again) and does for a Config.Strategy what a consumer does (Maintain,
// then RunMaintenance and Warm in the background: idset's retention
// sweeper, bloom's partitions). A strategy that must be maintained before
// it claims (bloom) answers 503 until then: call Maintain before serving.
//
// Config.Hooks takes the consumer's hooks: each request with a key is
// reported as a batch of one message (its strategy ResponsesStrategy
// without a Config.Strategy), with outcome applied (stored),
// duplicate (replayed), mismatch (422), retried (rolled back, 409 or 503)
// or unknown (COMMIT outcome unknown), so the Prometheus (effprom) and
// OpenTelemetry (effotel) adapters serve it unchanged.
//
// Every statement works behind PgBouncer in transaction pooling: the lock
// is transaction-level. The response is buffered until the commit, so a
// wrapped handler cannot stream (http.Flusher and http.Hijacker are not
// offered).
package idempotency
