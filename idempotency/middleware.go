package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/dedupe/idset"
)

// ReplayedHeader is set to "true" on a response replayed from the store.
const ReplayedHeader = "Idempotent-Replayed"

// ErrInFlight is the error hooks see for a request answered 409 because
// its key's first request was still running.
var ErrInFlight = errors.New("idempotency: the key's first request is still running")

// Middleware runs handlers under idempotency keys. It is safe for
// concurrent use; one Middleware may wrap many handlers.
type Middleware struct {
	db      dedupe.DB
	cfg     Config
	log     *slog.Logger
	store   store
	hooks   *hooks
	headers []string // stored response headers, canonical
	commit  dedupe.Committer
	retry   string // Retry-After value
}

// DefaultStrategy returns the strategy a Config without one uses: an
// idset.Strategy with its defaults (the "processed" table in the
// "effectively" schema, 7 days' retention).
func DefaultStrategy() (dedupe.Strategy, error) { return idset.New(idset.Config{}) }

// New returns a Middleware that claims keys with cfg.Strategy through db
// and stores responses in cfg's table. It fills
// in cfg's defaults and validates it; the error matches
// dedupe.ErrInvalidConfig for a bad value, including a strategy that cannot
// claim an idempotency key (one that needs a sender and sequence number,
// such as highwater). Call Migrate (or apply Migrations) before serving,
// and run Run for the strategy's maintenance and the responses' sweeper.
//
// db serves concurrent requests, so it must be safe for concurrent use: a
// *pgxpool.Pool (with which each request costs one round trip fewer), or
// any dedupe.DB that is.
func New(db dedupe.DB, cfg Config) (*Middleware, error) {
	if db == nil {
		return nil, dedupe.ConfigErrorf("idempotency", "db", "must not be nil")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Strategy == nil {
		s, err := DefaultStrategy()
		if err != nil {
			return nil, err
		}
		cfg.Strategy = s
	}
	if err := checkStrategy(cfg.Strategy, cfg.MaxKeyLen); err != nil {
		return nil, err
	}
	r, _ := cfg.Strategy.(dedupe.Retainer)
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
		if r != nil && r.Retention() > 0 {
			cfg.Retention = r.Retention() + RetentionMargin
		}
	}
	m := &Middleware{db: db, cfg: cfg, log: cfg.Logger, store: newStore(cfg.Schema, cfg.Table), hooks: newHooks(cfg.Hooks)}
	if r != nil && r.Retention() > cfg.Retention {
		m.log.Warn("idempotency: responses are kept for less time than the strategy's markers: a retry in between gets 422 instead of its response",
			"retention", cfg.Retention, "marker_retention", r.Retention())
	}
	m.headers = []string{"Content-Type", "Location"}
	for _, h := range cfg.Headers {
		m.headers = append(m.headers, http.CanonicalHeaderKey(h))
	}
	m.commit, _ = cfg.Strategy.(dedupe.Committer)
	m.retry = strconv.Itoa(max(1, int((cfg.RetryAfter+time.Second-1)/time.Second)))
	return m, nil
}

// checkStrategy refuses strategies that cannot claim a key by (Scope, ID):
// a dedupe.Sequencer, or one whose KeyChecker rejects such a key.
func checkStrategy(s dedupe.Strategy, maxKeyLen int) error {
	if _, ok := s.(dedupe.Sequencer); ok {
		return dedupe.ConfigErrorf("idempotency", "Strategy", "%s judges messages by sender and sequence number; an idempotency key needs a strategy keyed by ID (idset, bloom)", s.Name())
	}
	if c, ok := s.(dedupe.KeyChecker); ok {
		k := dedupe.Key{Scope: "idempotency-check", ID: strings.Repeat("k", maxKeyLen)}
		if err := c.CheckKey(k); err != nil {
			return dedupe.ConfigErrorf("idempotency", "Strategy", "%s cannot claim an idempotency key of %d bytes: %v", s.Name(), maxKeyLen, err)
		}
	}
	return nil
}

// Wrap returns next under the middleware (see the package documentation
// for what each request gets).
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
}

// Handler is Wrap for a function.
func (m *Middleware) Handler(next http.HandlerFunc) http.Handler { return m.Wrap(next) }

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	values := r.Header.Values(m.cfg.Header)
	if len(values) == 0 {
		if m.cfg.Optional {
			next.ServeHTTP(w, r)
			return
		}
		m.problem(w, http.StatusBadRequest, "Idempotency key required", "This request needs an "+m.cfg.Header+" header.")
		return
	}
	key, err := parseKey(values, m.cfg.MaxKeyLen)
	if err != nil {
		m.problem(w, http.StatusBadRequest, "Invalid idempotency key", m.cfg.Header+": "+err.Error()+".")
		return
	}
	scope := m.cfg.Name
	if m.cfg.Scope != nil {
		tenant, err := m.cfg.Scope(r)
		if err != nil {
			m.problem(w, http.StatusBadRequest, "No idempotency scope", err.Error())
			return
		}
		scope += "/" + tenant
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, m.cfg.MaxRequestBytes))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			m.problem(w, http.StatusRequestEntityTooLarge, "Request body too large", fmt.Sprintf("The body is over the limit of %d bytes.", mb.Limit))
			return
		}
		m.problem(w, http.StatusBadRequest, "Unreadable request body", err.Error())
		return
	}
	fp, err := Fingerprint(r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), body)
	if err != nil {
		m.problem(w, http.StatusBadRequest, "Malformed JSON body", err.Error())
		return
	}
	k := dedupe.Key{Scope: scope, ID: key, Fingerprint: fp}
	if err := dedupe.Validate(k, dedupe.DefaultMaxIDLen); err != nil {
		m.problem(w, http.StatusBadRequest, "Invalid idempotency scope", err.Error())
		return
	}
	sp := m.begin(r.Context(), r, k, body)
	defer func() {
		if p := recover(); p != nil {
			// run's deferred rollback has run: no key is left behind.
			m.end(sp, consumer.OutcomeRetried, fmt.Errorf("idempotency: handler panicked: %v", p))
			panic(p)
		}
	}()
	o, err := m.run(sp.ctx, w, r, next, k, body)
	m.end(sp, o, err)
}

// run claims k in a transaction and answers the request: the stored
// response of a duplicate, the handler's response otherwise.
func (m *Middleware) run(ctx context.Context, w http.ResponseWriter, r *http.Request, next http.Handler, k dedupe.Key, body []byte) (consumer.Outcome, error) {
	tx, locked, err := m.beginLocked(ctx, lockKey(k.Scope, k.ID))
	if err != nil {
		return m.dbFailure(w, "begin", err)
	}
	if !locked {
		w.Header().Set("Retry-After", m.retry)
		m.problem(w, http.StatusConflict, "Request in progress", "A request with this idempotency key is still being processed; retry later.")
		return consumer.OutcomeRetried, ErrInFlight
	}
	defer tx.rollback(ctx) // a panic too; after a commit it only releases the connection
	rollback := func() { tx.rollback(ctx) }
	keys := []dedupe.Key{k}
	verdicts, err := m.cfg.Strategy.Claim(ctx, tx.Tx, keys)
	if errors.Is(err, dedupe.ErrInvalidKey) {
		rollback()
		m.problem(w, http.StatusBadRequest, "Invalid idempotency key", err.Error())
		return consumer.OutcomeRetried, err
	}
	if err != nil {
		return m.dbFailure(w, "claim", err)
	}
	switch verdicts[0] {
	case dedupe.VerdictNew:
	case dedupe.VerdictDuplicate:
		return m.replay(ctx, w, tx, k)
	case dedupe.VerdictMismatch:
		rollback()
		m.problem(w, http.StatusUnprocessableEntity, "Idempotency key reused", "This idempotency key was used with a different request (method, path or body).")
		return consumer.OutcomeMismatch, nil
	default:
		return m.dbFailure(w, "claim", fmt.Errorf("strategy %s answered %v for an idempotency key", m.cfg.Strategy.Name(), verdicts[0]))
	}

	req := &request{tx: ownedTx{tx.Tx}, key: k.ID, scope: k.Scope}
	rec := newRecorder(m.cfg.MaxResponseBytes)
	r2 := r.WithContext(context.WithValue(ctx, ctxKey{}, req))
	r2.Body = io.NopCloser(bytesReader(body))
	next.ServeHTTP(rec, r2) // a panic rolls back (deferred) and goes on up
	if rec.overflow {
		rollback()
		m.log.Error("idempotency: response body over the limit; rolled back", "limit", m.cfg.MaxResponseBytes, "scope", k.Scope, "key", k.ID)
		m.problem(w, http.StatusInternalServerError, "Response too large", "The response was too large to store; nothing was done.")
		return consumer.OutcomeRetried, ErrResponseTooLarge
	}
	if err := ctx.Err(); err != nil {
		// The client is gone (or the server is shutting down): as after a
		// crash, nothing stays; its retry runs the request again.
		rollback()
		return consumer.OutcomeRetried, fmt.Errorf("idempotency: request context done before commit: %w", err)
	}
	status := rec.result()
	if status >= 400 && !req.final {
		rollback()
		send(w, rec.header, status, rec.body)
		return consumer.OutcomeRetried, fmt.Errorf("idempotency: handler answered %d without marking it final: rolled back", status)
	}
	resp := stored{status: status, headers: keep(rec.header, m.headers), body: rec.body}
	if resp.body == nil {
		resp.body = []byte{} // a response without a body (201, 204) is stored with an empty one
	}
	err = tx.commitWith(ctx, m.store.insertSQL, k.Scope, k.ID, k.Fingerprint, resp.status, resp.headers, resp.body)
	var se *errStore
	if errors.As(err, &se) {
		return m.dbFailure(w, "store response", se.err)
	}
	if err != nil {
		outcome, retry := classifyCommit(err)
		if outcome == commitUnknown {
			w.Header().Set("Retry-After", m.retry)
			m.problem(w, http.StatusServiceUnavailable, "Outcome unknown", "The database connection was lost while committing; retry with the same key to get the outcome.")
			return consumer.OutcomeUnknown, err
		}
		if retry {
			return m.dbFailure(w, "commit", err)
		}
		m.log.Error("idempotency: commit refused", "scope", k.Scope, "key", k.ID, "err", err)
		m.problem(w, http.StatusInternalServerError, "Commit refused", "The database refused to commit the request's writes; nothing was done.")
		return consumer.OutcomeRetried, err
	}
	tx.rollback(ctx) // releases the connection before the client is answered
	if m.commit != nil {
		m.commit.Committed(keys, verdicts)
	}
	send(w, rec.header, status, rec.body)
	return consumer.OutcomeApplied, nil
}

// replay answers a duplicate with its stored response.
func (m *Middleware) replay(ctx context.Context, w http.ResponseWriter, tx *keyTx, k dedupe.Key) (consumer.Outcome, error) {
	resp, ok, err := m.store.load(ctx, tx.Tx, k.Scope, k.ID)
	if err != nil {
		return m.dbFailure(w, "load response", err)
	}
	tx.rollback(ctx)
	if m.commit != nil {
		m.commit.Committed([]dedupe.Key{k}, []dedupe.Verdict{dedupe.VerdictDuplicate})
	}
	if !ok {
		m.problem(w, http.StatusUnprocessableEntity, "Idempotency key expired", "This idempotency key was used, and its stored response has expired; use a new key.")
		return consumer.OutcomeDuplicate, errors.New("idempotency: duplicate key without a stored response (expired)")
	}
	h := make(http.Header, len(resp.headers)/2+1)
	for i := 0; i+1 < len(resp.headers); i += 2 {
		h.Add(resp.headers[i], resp.headers[i+1])
	}
	h.Set(ReplayedHeader, "true")
	send(w, h, resp.status, resp.body)
	return consumer.OutcomeDuplicate, nil
}

// dbFailure answers a failure of the middleware's own statements: 503 with
// Retry-After when it passes, 500 otherwise. Nothing was stored.
func (m *Middleware) dbFailure(w http.ResponseWriter, step string, err error) (consumer.Outcome, error) {
	err = fmt.Errorf("idempotency: %s: %w", step, err)
	if transient(err) {
		w.Header().Set("Retry-After", m.retry)
		m.problem(w, http.StatusServiceUnavailable, "Service unavailable", "A transient database failure; nothing was done. Retry with the same key.")
		return consumer.OutcomeRetried, err
	}
	m.log.Error("idempotency: database failure", "step", step, "err", err)
	m.problem(w, http.StatusInternalServerError, "Internal error", "A database failure; nothing was done.")
	return consumer.OutcomeRetried, err
}

// send writes a response: h's headers, status and body.
func send(w http.ResponseWriter, h http.Header, status int, body []byte) {
	dst := w.Header()
	for name, vs := range h {
		dst[name] = vs
	}
	dst.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// problem answers with an RFC 9457 problem document.
func (m *Middleware) problem(w http.ResponseWriter, status int, title, detail string) {
	b, _ := json.Marshal(problemDoc{Type: "about:blank", Title: title, Status: status, Detail: detail})
	h := http.Header{"Content-Type": {"application/problem+json"}}
	send(w, h, status, b)
}

type problemDoc struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}
