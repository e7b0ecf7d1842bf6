package idempotency

import (
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/internal/logx"
	"github.com/effectively-once/effectively/pg"
)

// Defaults of the Config fields.
const (
	DefaultName             = "http"
	DefaultHeader           = "Idempotency-Key"
	DefaultTable            = "idempotency_responses"
	DefaultMaxKeyLen        = 255
	DefaultMaxRequestBytes  = 1 << 20
	DefaultMaxResponseBytes = 1 << 20
	DefaultRetryAfter       = time.Second
	DefaultSweepBatch       = 1000
	DefaultSweepInterval    = time.Minute
	// DefaultKeyRetention is the responses' retention without a
	// Config.Strategy: 7 days and an hour, what the default strategy's
	// markers and RetentionMargin gave when keys were claimed by an idset
	// marker.
	DefaultKeyRetention = 7*24*time.Hour + RetentionMargin
	// DefaultRetention is the responses' retention when Config.Strategy's
	// markers do not expire (it is not a dedupe.Retainer).
	DefaultRetention = 24 * time.Hour
	// RetentionMargin is how much longer than the strategy's markers the
	// responses are kept by default, so that a key whose marker still
	// exists always finds its response.
	RetentionMargin = time.Hour
)

// Config configures a Middleware. Scope (or SingleTenant) must be set;
// every other field has a default: keys claimed by their rows in the
// responses table in the "effectively" schema, a key required on every
// wrapped route.
type Config struct {
	// Name names the middleware in hooks, metrics and logs (the Consumer of
	// the consumer.BatchInfo it reports) and prefixes every scope, so that
	// its markers never meet a consumer's in a shared table. It must not
	// contain "/". Defaults to "http".
	Name string
	// Strategy, when set, claims each key also with a dedupe strategy's
	// marker, after the key's row in the responses table (which is its
	// claim, and decides) was found missing, at the cost of one round trip
	// and one row more per new key. It is what lets instances of a version
	// that claimed keys by markers alone (idset by default: set
	// DefaultStrategy()) serve the same keys during an upgrade: they find
	// the markers this one writes. It must key by (Scope, ID): idset and
	// bloom do; a strategy that needs a sender and sequence number
	// (highwater) is refused by New. Defaults to none.
	Strategy dedupe.Strategy
	// Scope returns the principal a request is made by (the authenticated
	// account or tenant, taken from what authentication established, never
	// from a header the client chooses): keys of two principals never
	// collide, and one principal's stored response is never replayed to
	// another. An error answers the request 400 with the error's text, and
	// nothing runs: put authentication in front of the middleware. New
	// refuses a Config with neither Scope nor SingleTenant.
	Scope func(*http.Request) (string, error)
	// SingleTenant declares that every request with a key may be answered
	// with any other's stored response: one scope for all requests, for a
	// service with a single caller (an internal service behind its own
	// authentication). It must not be set with Scope. Defaults to false.
	SingleTenant bool
	// Optional lets requests without a key through to the handler, without
	// a transaction (Tx returns nil). Defaults to false: a request without
	// a key gets 400.
	Optional bool
	// Header is the request header that carries the key. Defaults to
	// "Idempotency-Key".
	Header string
	// MaxKeyLen is the longest key accepted, in bytes; a longer one gets
	// 400. At most dedupe.DefaultMaxIDLen. Defaults to 255.
	MaxKeyLen int
	// MaxRequestBytes is the largest request body read; a larger one gets
	// 413 and nothing runs. Defaults to 1 MiB.
	MaxRequestBytes int64
	// MaxResponseBytes is the largest response body the middleware stores;
	// a handler that writes more gets its transaction rolled back and the
	// client a 500, and the middleware logs an error naming the limit.
	// Defaults to 1 MiB.
	MaxResponseBytes int
	// Headers are the response headers stored and replayed besides
	// Content-Type and Location (which always are). Headers that carry
	// credentials (Set-Cookie, Authorization, WWW-Authenticate and the
	// like; see CredentialHeaders) are refused by New: a replay would hand
	// them to whoever holds the key. Defaults to none.
	Headers []string
	// RetryAfter is the Retry-After sent with a 409 (the key's first
	// request is still running) or a 503 (a transient database failure).
	// Defaults to 1 second; it is sent in whole seconds, at least 1.
	RetryAfter time.Duration
	// Schema holds the responses table. Defaults to "effectively".
	Schema string
	// Table is the responses table's name. Defaults to
	// "idempotency_responses".
	Table string
	// Retention is how long a stored response, and so its key, is kept:
	// after it, the key is new again. With a Strategy it must not be
	// shorter than the strategy's markers' retention, or a key whose
	// marker remains could find no response to replay (the client then
	// gets 422). Defaults to 7 days and an hour (DefaultKeyRetention)
	// without a Strategy, else to the strategy's retention plus
	// RetentionMargin, or DefaultRetention when its markers do not expire.
	Retention time.Duration
	// SweepBatch is the most responses one sweep statement deletes.
	// Defaults to 1000.
	SweepBatch int
	// SweepInterval is the pause between sweeps in Run. Defaults to 1
	// minute.
	SweepInterval time.Duration
	// Hooks observe the middleware. Each request with a key is reported as
	// a batch of one message: BatchStart (consumer.BatchStartHook) before
	// its transaction, BatchDone and MessageDone (consumer.MessageHook)
	// when it is answered, so the Prometheus and OpenTelemetry adapters of
	// the consumer serve it unchanged; RequestOf gives them the HTTP
	// request (method, route, status, replayed), from which effotel makes
	// an HTTP server span. Defaults to none.
	Hooks []consumer.Hook
	// Logger receives errors (a response over the size limit, a failed
	// sweep). Defaults to warnings and errors on stderr.
	Logger *slog.Logger
}

// CredentialHeaders are the response headers Config.Headers must not
// name: they carry credentials or authentication challenges of the
// caller the response was made for.
var CredentialHeaders = []string{
	"Set-Cookie", "Set-Cookie2", "Cookie", "Authorization", "Proxy-Authorization",
	"Www-Authenticate", "Proxy-Authenticate", "Authentication-Info", "Proxy-Authentication-Info",
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Header == "" {
		c.Header = DefaultHeader
	}
	if c.MaxKeyLen == 0 {
		c.MaxKeyLen = DefaultMaxKeyLen
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.Schema == "" {
		c.Schema = pg.DefaultSchema
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.SweepBatch == 0 {
		c.SweepBatch = DefaultSweepBatch
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.Logger == nil {
		c.Logger = logx.Default()
	}
	return c
}

func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return pg.ConfigErrorf("idempotency", field, format, args...)
	}
	for _, f := range [...]struct{ name, v string }{{"Schema", c.Schema}, {"Table", c.Table}} {
		if err := pg.ValidateIdentifier(f.v, len("_created_at_idx")); err != nil {
			return bad(f.name, "%v", err)
		}
	}
	switch {
	case strings.Contains(c.Name, "/"):
		return bad("Name", "must not contain %q, got %q", "/", c.Name)
	case http.CanonicalHeaderKey(c.Header) == "" || strings.ContainsAny(c.Header, " :\r\n\t"):
		return bad("Header", "%q is not a header name", c.Header)
	case c.MaxKeyLen < 0 || c.MaxKeyLen > dedupe.DefaultMaxIDLen:
		return bad("MaxKeyLen", "must be between 1 and %d (0 for the default), got %d", dedupe.DefaultMaxIDLen, c.MaxKeyLen)
	case c.MaxRequestBytes < 0:
		return bad("MaxRequestBytes", "must not be negative, got %d", c.MaxRequestBytes)
	case c.MaxResponseBytes < 0:
		return bad("MaxResponseBytes", "must not be negative, got %d", c.MaxResponseBytes)
	case c.RetryAfter < 0:
		return bad("RetryAfter", "must not be negative, got %v", c.RetryAfter)
	case c.Retention < 0:
		return bad("Retention", "must not be negative, got %v", c.Retention)
	case c.SweepBatch < 0:
		return bad("SweepBatch", "must not be negative, got %d", c.SweepBatch)
	case c.SweepInterval < 0:
		return bad("SweepInterval", "must not be negative, got %v", c.SweepInterval)
	}
	switch {
	case c.Scope == nil && !c.SingleTenant:
		return bad("Scope", "must be set to the authenticated principal of a request (or set SingleTenant for a service with one caller): without it one caller's stored response is replayed to another who sends the same key")
	case c.Scope != nil && c.SingleTenant:
		return bad("SingleTenant", "must not be set with Scope")
	}
	for _, h := range c.Headers {
		if h == "" || strings.ContainsAny(h, " :\r\n\t") {
			return bad("Headers", "%q is not a header name", h)
		}
		if slices.Contains(CredentialHeaders, http.CanonicalHeaderKey(h)) {
			return bad("Headers", "%s carries credentials: a stored copy would be replayed to whoever sends the key", http.CanonicalHeaderKey(h))
		}
	}
	return nil
}
