package webhook

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/internal/logx"
	"github.com/effectively-once/effectively/pg"
)

// Defaults of the Config fields.
const (
	DefaultMaxBodyBytes      = 1 << 20
	DefaultLanes             = 8
	DefaultMaxQueued         = 1000
	DefaultMaxTracked        = 100_000
	DefaultRedeliveryHorizon = 72 * time.Hour
	DefaultName              = "webhook"
	DefaultAttemptsTable     = "webhook_attempts"
)

// IDFunc derives the provider's event ID from a verified request: the
// dedupe ID of the message. An error, or an empty ID, makes the message one
// without an ID, which the consumer parks with reason invalid_key (see the
// package documentation).
type IDFunc func(r *http.Request, body []byte) (string, error)

// LaneFunc names the lane of a verified request whose event ID is id (empty
// when it has none). Requests of one lane are handed to the consumer in the
// order they arrived, one batch at a time; lanes run in parallel.
type LaneFunc func(r *http.Request, body []byte, id string) string

// Config configures a Source. Verifier and ID are required; every other
// field's zero value is a usable default.
type Config struct {
	// Verifier checks each request's signature before anything else is
	// done with it. Required: use StripeVerifier, GitHubVerifier, your own
	// Verifier, or Unverified() to accept requests without checking them.
	Verifier Verifier
	// ID derives the event ID, the dedupe ID of the message, from a
	// verified request: JSONField("id") for Stripe. Defaults to the
	// Verifier's SignedID when it is a SignedIDVerifier (GitHubVerifier: a
	// hash of the body; StandardVerifier: the webhook-id header), and is
	// required otherwise.
	//
	// With a SignedIDVerifier, ID sees only what the signature covers: the
	// body and the verifier's SignedHeaders, without the query string or
	// any other header. An ID that cannot be read from those (such as
	// Header("X-GitHub-Delivery"), which GitHub does not sign, so that a
	// captured delivery sent again with a new one would be a new event) is
	// replaced by the SignedID, and the source logs a warning the first
	// time it does so.
	ID IDFunc

	// Lane names a request's lane. Defaults to a hash of the event ID over
	// Lanes lanes ("webhook/0" …), so that events run in parallel batches
	// and the deliveries of one event share a lane. Set it to keep, say, a
	// customer's events in arrival order (see the package documentation
	// for what a provider's retries do to that order).
	Lane LaneFunc
	// Lanes is the number of lanes of the default Lane. Ignored when Lane
	// is set. Defaults to 8 (DefaultLanes).
	Lanes int

	// Headers lists the request headers copied to Message.Headers (and so
	// kept with a parked message), in this order. Defaults to
	// DefaultHeaders(): Content-Type, Content-Encoding, User-Agent and the
	// event, delivery and signature headers of Stripe, GitHub and Standard
	// Webhooks, so that a credential a request carries (an API key, a
	// session token, a proxy's Authorization) never reaches the parked
	// table. Headers that carry credentials (Authorization, Cookie,
	// X-Api-Key, X-Amz-Security-Token …) cannot be listed. An empty,
	// non-nil list keeps none.
	Headers []string
	// Redact, when set, is called with every verified request's message
	// before it is handed to the consumer: what it removes or masks in
	// m.Value and m.Headers is what the handler sees and what a parked
	// row keeps. It runs after the signature was checked and the event ID
	// derived, so it cannot change either (the message's other fields are
	// restored after it); it should be deterministic, for
	// the payload fingerprint of a redelivery to match. A panic answers
	// the request 500 and keeps nothing of it. Defaults to nil: the
	// message as received.
	Redact func(m *consumer.Message)
	// MaxBodyBytes is the largest request body accepted; a larger one is
	// answered 413 and never handed to the consumer. Defaults to 1 MiB
	// (DefaultMaxBodyBytes). GitHub sends payloads of up to 25 MB.
	MaxBodyBytes int64
	// MaxQueued bounds the verified requests waiting for the consumer to
	// fetch them; a request that finds no room waits for some, until its
	// client gives up. Defaults to 1000 (DefaultMaxQueued).
	MaxQueued int
	// MaxTracked bounds the events whose delivery count the source keeps
	// in memory (see Attempts in the package documentation); past it the
	// event seen least recently is forgotten. Defaults to 100,000
	// (DefaultMaxTracked).
	MaxTracked int

	// DB, when set, keeps the delivery count of every event that failed
	// in PostgreSQL as well, in a table of this package (AttemptsTable,
	// created by the consumer's Migrate), read once per batch when it is
	// fetched and written once it settled, before its requests are
	// answered: an event is then parked at consumer.Config.MaxAttempts
	// across restarts and across the processes behind a load balancer.
	// Give it the consumer's database. Defaults to nil: counts are kept in
	// this process's memory only.
	DB pg.DB
	// Name tells this source's rows in the attempts table from those of
	// other sources sharing it: give each endpoint's Source its own (the
	// consumer's name, say). Defaults to "webhook" (DefaultName).
	Name string
	// Schema holds the attempts table. Defaults to "effectively"
	// (pg.DefaultSchema).
	Schema string
	// AttemptsTable is the attempts table's name. Defaults to
	// "webhook_attempts" (DefaultAttemptsTable).
	AttemptsTable string
	// RedeliveryHorizon is how long after its first delivery a provider
	// may deliver an event again (Stripe retries for up to three days);
	// the consumer warns at start-up when its strategy keeps markers for
	// less. Defaults to 72h (DefaultRedeliveryHorizon).
	RedeliveryHorizon time.Duration

	// Logger receives the source's logs: a rejected request is logged at
	// warning level. Defaults to warnings and errors on stderr.
	Logger *slog.Logger
	// Observe, when set, is called once for every request, when its answer
	// is decided (before it is written), for metrics. It must not block.
	Observe func(Delivery)
}

// ConfigError reports a bad Config value, with Package "webhook". It is the
// library's one configuration error, pg.ConfigError.
type ConfigError = pg.ConfigError

func (c Config) withDefaults() Config {
	if c.Lanes == 0 {
		c.Lanes = DefaultLanes
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxQueued == 0 {
		c.MaxQueued = DefaultMaxQueued
	}
	if c.MaxTracked == 0 {
		c.MaxTracked = DefaultMaxTracked
	}
	if c.RedeliveryHorizon == 0 {
		c.RedeliveryHorizon = DefaultRedeliveryHorizon
	}
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Schema == "" {
		c.Schema = pg.DefaultSchema
	}
	if c.AttemptsTable == "" {
		c.AttemptsTable = DefaultAttemptsTable
	}
	if c.Logger == nil {
		c.Logger = logx.Default()
	}
	return c
}

func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return pg.ConfigErrorf("webhook", field, format, args...)
	}
	switch {
	case c.Verifier == nil:
		return bad("Verifier", "is required: a verifier of the provider's signatures (StripeVerifier, GitHubVerifier), or webhook.Unverified() to accept unsigned requests")
	case c.ID == nil && !isSigned(c.Verifier):
		return bad("ID", `is required unless the Verifier is a SignedIDVerifier: how to find the event ID, such as webhook.JSONField("id")`)
	case c.Lanes < 1:
		return bad("Lanes", "must be at least 1 (0 for the default), got %d", c.Lanes)
	case c.MaxBodyBytes < 1:
		return bad("MaxBodyBytes", "must be positive (0 for the default), got %d", c.MaxBodyBytes)
	case c.MaxQueued < 1:
		return bad("MaxQueued", "must be at least 1 (0 for the default), got %d", c.MaxQueued)
	case c.MaxTracked < 1:
		return bad("MaxTracked", "must be at least 1 (0 for the default), got %d", c.MaxTracked)
	case c.RedeliveryHorizon < 0:
		return bad("RedeliveryHorizon", "must not be negative, got %s", c.RedeliveryHorizon)
	}
	if err := pg.ValidateIdentifier(c.Schema, 0); err != nil {
		return bad("Schema", "%v", err)
	}
	if err := pg.ValidateIdentifier(c.AttemptsTable, len("_updated_at")); err != nil {
		return bad("AttemptsTable", "%v", err)
	}
	if err := checkHeaders(c.Headers); err != nil {
		return bad("Headers", "%v", err)
	}
	return nil
}

func isSigned(v Verifier) bool {
	_, ok := v.(SignedIDVerifier)
	return ok
}
