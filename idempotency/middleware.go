package idempotency

import (
	"bytes"
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
	"github.com/effectively-once/effectively/internal/pgerr"
	"github.com/effectively-once/effectively/pg"
)

// ReplayedHeader is set to "true" on a response replayed from the store.
const ReplayedHeader = "Idempotent-Replayed"

// ErrInFlight is the error hooks see for a request answered 409 because
// its key's first request was still running.
var ErrInFlight = errors.New("idempotency: the key's first request is still running")

// Middleware runs handlers under idempotency keys. It is safe for
// concurrent use; one Middleware may wrap many handlers.
type Middleware struct {
	db      pg.DB
	cfg     Config
	log     *slog.Logger
	store   store
	hooks   *hooks
	headers []string // stored response headers, canonical
	commit  dedupe.Committer
	retry   string      // Retry-After value
	own     pgerr.Table // the responses table, as errors name it
}

// DefaultStrategy returns an idset.Strategy with its defaults (the
// "processed" table in the "effectively" schema, 7 days' retention): the
// strategy that claimed keys by default before a key's stored response
// became its claim. Set it as Config.Strategy while instances of such a
// version still serve the same keys (see Config.Strategy).
func DefaultStrategy() (dedupe.Strategy, error) { return idset.New(idset.Config{}) }

// New returns a Middleware that claims keys through db with the rows of
// cfg's responses table (and cfg.Strategy, when set). It fills
// in cfg's defaults and validates it; the error matches
// pg.ErrInvalidConfig for a bad value, including a strategy that cannot
// claim an idempotency key (one that needs a sender and sequence number,
// such as highwater). Call Migrate (or apply Migrations) before serving,
// and run Run for the responses' sweeper (and the strategy's maintenance).
//
// db serves concurrent requests, so it must be safe for concurrent use: a
// *pgxpool.Pool (with which each request costs one round trip fewer), or
// any pg.DB that is.
func New(db pg.DB, cfg Config) (*Middleware, error) {
	if db == nil {
		return nil, pg.ConfigErrorf("idempotency", "db", "must not be nil")
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	var r dedupe.Retainer
	if cfg.Strategy != nil {
		if err := checkStrategy(cfg.Strategy, cfg.MaxKeyLen); err != nil {
			return nil, err
		}
		r, _ = cfg.Strategy.(dedupe.Retainer)
	}
	if cfg.Retention == 0 {
		switch {
		case cfg.Strategy == nil:
			cfg.Retention = DefaultKeyRetention
		case r != nil && r.Retention() > 0:
			cfg.Retention = r.Retention() + RetentionMargin
		default:
			cfg.Retention = DefaultRetention
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
	if cfg.Strategy != nil {
		m.commit, _ = cfg.Strategy.(dedupe.Committer)
	}
	m.own = pgerr.Table{Schema: cfg.Schema, Name: cfg.Table}
	m.retry = strconv.Itoa(max(1, int((cfg.RetryAfter+time.Second-1)/time.Second)))
	return m, nil
}

// checkStrategy refuses strategies that cannot claim a key by (Scope, ID):
// a dedupe.Sequencer, or one whose KeyChecker rejects such a key.
func checkStrategy(s dedupe.Strategy, maxKeyLen int) error {
	if _, ok := s.(dedupe.Sequencer); ok {
		return pg.ConfigErrorf("idempotency", "Strategy", "%s judges messages by sender and sequence number; an idempotency key needs a strategy keyed by ID (idset, bloom)", s.Name())
	}
	if c, ok := s.(dedupe.KeyChecker); ok {
		k := dedupe.Key{Scope: "idempotency-check", ID: strings.Repeat("k", maxKeyLen)}
		if err := c.CheckKey(k); err != nil {
			return pg.ConfigErrorf("idempotency", "Strategy", "%s cannot claim an idempotency key of %d bytes: %v", s.Name(), maxKeyLen, err)
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
	ctx := r.Context()
	var info *Request
	sw := &statusWriter{ResponseWriter: w}
	if len(m.hooks.all) > 0 {
		info, ctx = newRequestInfo(r)
		w = sw
	}
	sp := m.begin(ctx, r, k, body)
	defer func() {
		if p := recover(); p != nil {
			// run's deferred rollback has run: no key is left behind.
			m.end(sp, consumer.OutcomeRetried, fmt.Errorf("idempotency: handler panicked: %v", p))
			panic(p)
		}
	}()
	o, err := m.run(sp.ctx, w, r, next, k, body)
	if info != nil {
		info.Status = sw.status
		info.Replayed = w.Header().Get(ReplayedHeader) == "true"
	}
	m.end(sp, o, err)
}

// run claims k in a transaction and answers the request: the stored
// response of a duplicate, the handler's response otherwise.
func (m *Middleware) run(ctx context.Context, w http.ResponseWriter, r *http.Request, next http.Handler, k dedupe.Key, body []byte) (consumer.Outcome, error) {
	tx, locked, err := m.beginLocked(ctx, lockKey(k.Scope, k.ID))
	if err != nil {
		return m.ownFailure(w, k, "begin", err)
	}
	if !locked {
		return m.held(ctx, w, k)
	}
	defer tx.rollback(ctx) // a panic too; after a commit it only releases the connection
	rollback := func() { tx.rollback(ctx) }
	// The key's row in the responses table is its claim: read under the
	// lock (with a pool, in the round trip of BEGIN and the lock), and
	// written, with the response, just before the COMMIT.
	prev, found, err := m.store.load(ctx, tx.Tx, k.Scope, k.ID)
	if inFlight(err) { // the lock, sent with the read, is held
		rollback()
		return m.held(ctx, w, k)
	}
	if err != nil {
		return m.ownFailure(w, k, "claim", err)
	}
	if found {
		rollback()
		return m.answerStored(w, k, prev)
	}
	keys, verdicts, o, err := m.claim(ctx, w, tx, k)
	if o != consumer.OutcomeApplied {
		return o, err
	}

	req := &request{tx: &ownedTx{Tx: tx.Tx}, key: k.ID, scope: k.Scope}
	rec := newRecorder(m.cfg.MaxResponseBytes)
	r2 := r.WithContext(context.WithValue(ctx, ctxKey{}, req))
	r2.Body = io.NopCloser(bytesReader(body))
	next.ServeHTTP(rec, r2) // a panic rolls back (deferred) and goes on up
	status := rec.result()
	resp := stored{status: status, body: rec.body, fingerprint: k.Fingerprint}
	var headerBytes int
	resp.headers, headerBytes = keep(rec.header, m.headers)
	if !bodyAllowed(status) {
		resp.body = nil // net/http sends none: neither is one stored
	}
	if rec.overflow || len(resp.body)+headerBytes > m.cfg.MaxResponseBytes {
		rollback()
		m.log.Error("idempotency: response over the size limit (body and stored headers); rolled back, the client gets 500",
			"limit", m.cfg.MaxResponseBytes, "scope", k.Scope, "key_hash", keyHash(k))
		m.problem(w, http.StatusInternalServerError, "Response too large", "The response was too large to store; nothing was done.")
		return consumer.OutcomeRetried, ErrResponseTooLarge
	}
	if err := ctx.Err(); err != nil {
		// The client is gone (or the server is shutting down): as after a
		// crash, nothing stays; its retry runs the request again.
		rollback()
		return consumer.OutcomeRetried, fmt.Errorf("idempotency: request context done before commit: %w", err)
	}
	if status >= 400 && !req.final {
		rollback()
		send(w, rec.header, status, rec.body)
		return consumer.OutcomeRetried, fmt.Errorf("idempotency: handler answered %d without marking it final: rolled back", status)
	}
	if resp.body == nil {
		resp.body = []byte{} // a response without a body (201, 204) is stored with an empty one
	}
	// From here on the client's going away must not cut the COMMIT short:
	// that would leave its outcome unknown.
	err = tx.commitWith(context.WithoutCancel(ctx), m.store.insertSQL, k.Scope, k.ID, k.Fingerprint, resp.status, resp.headers, resp.body)
	var se *errStore
	if errors.As(err, &se) {
		if req.tx.failed != nil {
			// The handler answered after one of its statements failed,
			// which aborted the transaction: answer for that failure.
			return m.writeFailure(w, k, req.tx.failed)
		}
		return m.ownFailure(w, k, "store response", se.err)
	}
	if err != nil {
		if pgerr.Classify(err) == pgerr.Lost {
			tx.rollback(ctx) // gives the lost connection back to be discarded
			return m.resolve(ctx, w, k, resp, rec.header, err)
		}
		return m.writeFailure(w, k, fmt.Errorf("commit: %w", err))
	}
	tx.rollback(ctx) // releases the connection before the client is answered
	if m.commit != nil && keys != nil {
		m.commit.Committed(keys, verdicts)
	}
	send(w, rec.header, status, rec.body)
	return consumer.OutcomeApplied, nil
}

// claim claims k with Config.Strategy, when there is one, for a key that
// has no stored response: applied (with the keys and verdicts to tell the
// strategy once committed) lets the handler run; any other outcome has
// been answered, and the transaction rolled back.
func (m *Middleware) claim(ctx context.Context, w http.ResponseWriter, tx *keyTx, k dedupe.Key) ([]dedupe.Key, []dedupe.Verdict, consumer.Outcome, error) {
	if m.cfg.Strategy == nil {
		return nil, nil, consumer.OutcomeApplied, nil
	}
	keys := []dedupe.Key{k}
	verdicts, err := m.cfg.Strategy.Claim(ctx, tx.Tx, keys)
	if errors.Is(err, dedupe.ErrInvalidKey) {
		tx.rollback(ctx)
		m.problem(w, http.StatusBadRequest, "Invalid idempotency key", err.Error())
		return nil, nil, consumer.OutcomeRetried, err
	}
	if err != nil {
		o, err := m.ownFailure(w, k, "claim", err)
		return nil, nil, o, err
	}
	switch verdicts[0] {
	case dedupe.VerdictNew:
		return keys, verdicts, consumer.OutcomeApplied, nil
	case dedupe.VerdictDuplicate:
		// A marker without a stored response: the response expired first.
		tx.rollback(ctx)
		m.committedDuplicate(k)
		m.problem(w, http.StatusUnprocessableEntity, "Idempotency key expired", "This idempotency key was used, and its stored response has expired; use a new key.")
		return nil, nil, consumer.OutcomeDuplicate, errors.New("idempotency: duplicate key without a stored response (expired)")
	case dedupe.VerdictMismatch:
		tx.rollback(ctx)
		m.mismatch(w)
		return nil, nil, consumer.OutcomeMismatch, nil
	default:
		o, err := m.ownFailure(w, k, "claim", fmt.Errorf("strategy %s answered %v for an idempotency key", m.cfg.Strategy.Name(), verdicts[0]))
		return nil, nil, o, err
	}
}

// held answers a request whose key's lock another transaction holds: the
// stored response when the key is complete (a concurrent replay holds the
// lock, or the first request committed a moment ago), read without the
// lock, so that a replay never waits and never gets 409; 409 only while
// the key's first request is still running.
func (m *Middleware) held(ctx context.Context, w http.ResponseWriter, k dedupe.Key) (consumer.Outcome, error) {
	resp, ok, err := m.store.load(ctx, m.db, k.Scope, k.ID)
	if err != nil {
		return m.ownFailure(w, k, "load response", err)
	}
	if !ok {
		w.Header().Set("Retry-After", m.retry)
		m.problem(w, http.StatusConflict, "Request in progress", "A request with this idempotency key is still being processed; retry later.")
		return consumer.OutcomeRetried, ErrInFlight
	}
	return m.answerStored(w, k, resp)
}

// answerStored answers a key that has a stored response: replayed to the
// same request, 422 to another.
func (m *Middleware) answerStored(w http.ResponseWriter, k dedupe.Key, resp stored) (consumer.Outcome, error) {
	if !bytes.Equal(resp.fingerprint, k.Fingerprint) {
		m.mismatch(w)
		return consumer.OutcomeMismatch, nil
	}
	m.committedDuplicate(k)
	sendReplay(w, resp)
	return consumer.OutcomeDuplicate, nil
}

func (m *Middleware) committedDuplicate(k dedupe.Key) {
	if m.commit != nil {
		m.commit.Committed([]dedupe.Key{k}, []dedupe.Verdict{dedupe.VerdictDuplicate})
	}
}

func (m *Middleware) mismatch(w http.ResponseWriter) {
	m.problem(w, http.StatusUnprocessableEntity, "Idempotency key reused", "This idempotency key was used with a different request (method, path or body).")
}

// sendReplay writes a stored response, marked as replayed.
func sendReplay(w http.ResponseWriter, resp stored) {
	h := resp.header()
	h.Set(ReplayedHeader, "true")
	send(w, h, resp.status, resp.body)
}

// bodyAllowed reports whether a response with status may have a body
// (RFC 9110: not 1xx, 204 or 304).
func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// send writes a response: h's headers, status and body.
func send(w http.ResponseWriter, h http.Header, status int, body []byte) {
	dst := w.Header()
	for name, vs := range h {
		dst[name] = vs
	}
	if bodyAllowed(status) {
		dst.Set("Content-Length", strconv.Itoa(len(body)))
	}
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
