package consumer

import (
	"log/slog"
	"time"

	"github.com/effectively-once/effectively/consumer/parked"
	"github.com/effectively-once/effectively/consumer/standby"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/internal/logx"
	"github.com/effectively-once/effectively/pg"
)

// MismatchPolicy says what to do with a message whose key was already
// processed with another payload fingerprint.
type MismatchPolicy uint8

const (
	// MismatchDuplicate counts and logs the mismatch and treats the message as
	// a duplicate: nothing runs, it is acknowledged.
	MismatchDuplicate MismatchPolicy = iota
	// MismatchPark parks the message for a person to look at.
	MismatchPark
)

// Defaults of the Config fields. MaxKeyLen, Schema and ParkedTable default
// to their owners' constants: dedupe.DefaultMaxIDLen, pg.DefaultSchema and
// parked.DefaultTable.
const (
	defaultBatchSize       = 100
	defaultConcurrency     = 4
	defaultMaxAttempts     = 10
	defaultRetryBackoff    = time.Second
	defaultMaxRetryBackoff = 5 * time.Minute
	defaultGapDelay        = time.Second
	defaultGapMaxAttempts  = 60
	defaultShutdownTimeout = 30 * time.Second
	defaultIdleTxTimeout   = 10 * time.Second
)

// MaxBatchSize is the largest Config.BatchSize accepted.
const MaxBatchSize = 10000

// parkedIndexReserve is the room ParkedTable leaves for the longest suffix
// of its indexes' names (see parked.Line).
const parkedIndexReserve = len("_message_hash_idx")

// Config configures a Consumer. The zero value of every field but Name,
// Strategy and one of Handler, QueueHandler or BatchHandler is a usable
// default.
type Config struct {
	// Name identifies the consumer in logs and metrics. Required.
	Name string
	// Scope namespaces the dedupe markers. Defaults to Name, so two consumers
	// with different names each apply a message once.
	Scope string
	// Strategy recognises duplicates. Required.
	Strategy dedupe.Strategy
	// Handler applies one message, executing its statements in the
	// batch's transaction. Exactly one of Handler, QueueHandler and
	// BatchHandler is required; the package documentation says which to
	// choose.
	Handler Handler
	// QueueHandler applies one message by queueing its statements, which
	// the consumer sends for the whole batch in one round trip.
	QueueHandler QueueHandler
	// BatchHandler applies all new messages of a batch at once.
	BatchHandler BatchHandler
	// NoInsertMerge sends a QueueHandler's statements exactly as queued.
	// By default, a run of single-row INSERTs of the same text with no
	// callback (INSERT INTO t (a, b) VALUES ($1, $2)), queued one after
	// the other by one message or by consecutive ones, is sent as one
	// multi-row INSERT of the same rows in the same order, which
	// PostgreSQL runs several times faster. A FOR EACH STATEMENT trigger
	// on the table then fires once for the merged rows; set NoInsertMerge
	// if that matters. Defaults to false: INSERTs are merged.
	NoInsertMerge bool
	// KeyFunc derives each message's dedupe key. Defaults to DefaultKey
	// (the source's default ID).
	KeyFunc KeyFunc
	// NoFingerprint turns off payload fingerprints, and with them mismatch
	// detection. Defaults to false: fingerprints are on.
	NoFingerprint bool
	// Fingerprint chooses what a payload fingerprint hashes. Defaults to
	// FingerprintBytes.
	Fingerprint FingerprintMode
	// MaxKeyLen is the longest dedupe ID (and sender), in bytes; longer keys
	// are parked. Defaults to 512 (dedupe.DefaultMaxIDLen).
	MaxKeyLen int

	// BatchSize is the most messages fetched and committed in one
	// transaction. At most MaxBatchSize. Defaults to 100.
	BatchSize int
	// Concurrency is how many batches (of different lanes) run at once.
	// Each holds one connection of the pool for its transaction; Run
	// reports at start-up a pool too small for it (MaxConns below
	// Concurrency, plus one for the strategy's background work, if it
	// has any). Defaults to 4.
	Concurrency int

	// MaxAttempts is how many times a failing message is tried before it is
	// parked. Attempts are counted from the source's delivery count
	// (Message.Attempt), less the deliveries this process saw the message
	// spend waiting (on a sequence gap, behind an earlier message of its
	// sender, or in a batch that rolled back as a whole) and those whose
	// handler met a transient database error (*TransientError: a lock
	// held elsewhere past lock_timeout, say), which are retried without
	// limit. Defaults to 10.
	MaxAttempts int
	// RetryBackoff is the delay before the second attempt; it doubles with
	// each attempt, with jitter. Defaults to 1s.
	RetryBackoff time.Duration
	// MaxRetryBackoff caps the delay between attempts. Defaults to 5m.
	MaxRetryBackoff time.Duration
	// GapDelay is how long a message that arrived ahead of its sequence (a
	// gap) waits before it is delivered again. Defaults to 1s.
	GapDelay time.Duration
	// GapMaxAttempts is how many deliveries a message may spend waiting for a
	// gap before it is parked with reason "gap". Defaults to 60.
	GapMaxAttempts int
	// OnMismatch says what to do with a key reused for another payload.
	// Defaults to MismatchDuplicate.
	OnMismatch MismatchPolicy

	// Schema holds the parked-messages table. At most 63 bytes of UTF-8
	// without NUL bytes, quoted wherever it is used. Defaults to
	// "effectively" (pg.DefaultSchema).
	Schema string
	// ParkedTable is the parked-messages table's name. Its indexes are named
	// after it with suffixes of up to 17 bytes, so it may be at most 46
	// bytes (of UTF-8 without NUL bytes). Defaults to "parked"
	// (parked.DefaultTable).
	ParkedTable string

	// ShutdownTimeout bounds how long Run waits, after its context is done,
	// for in-flight batches to commit or roll back and be settled. Past it,
	// the batches' contexts are cancelled and Run returns an error matching
	// ErrShutdownTimeout without waiting for handlers that ignore their
	// context: such a batch cannot commit any more, and its messages are
	// delivered again. Defaults to 30s.
	ShutdownTimeout time.Duration
	// SourceFailureTimeout is how long the source's Fetch may keep failing,
	// with no batch fetched in between, before Run stops and returns the
	// error. Until then each failure is logged and Fetch is tried again
	// with backoff. A Fetch error wrapped with Permanent stops Run at once.
	// Defaults to 0: Fetch is retried for as long as Run runs.
	SourceFailureTimeout time.Duration
	// IdleTxTimeout bounds how long a batch transaction may stay idle
	// between two statements: every batch transaction sets PostgreSQL's
	// idle_in_transaction_session_timeout to it (SET LOCAL, in the same
	// round trip as BEGIN), so the server ends the session of a worker
	// that freezes in the middle of a batch (stopped, a long GC pause, a
	// lost host) and releases its locks: the markers it claimed and the
	// source's rows (Kafka's offsets) that the batch's redelivery to
	// another worker would otherwise wait for, as long as the freeze
	// lasts. A handler that waits on something else for longer between
	// two statements of its transaction (a slow HTTP call, say) has its
	// batch fail and retried, counting an attempt: raise the timeout for
	// it, or better, do such work outside the transaction. A negative
	// value leaves the server's setting (the role's or database's
	// idle_in_transaction_session_timeout, read at start-up, then decides
	// which handler calls are blamed); a positive one above the server's
	// setting is logged at start-up, since it raises the DBA's limit for
	// the batch transactions. Defaults to 10s.
	IdleTxTimeout time.Duration
	// StandbyAck acknowledges a batch to its source only once its commit
	// is on the primary's standbys, so that a failover to an asynchronous
	// standby loses nothing acknowledged (see standby.Config). Defaults to
	// off: a batch is acknowledged once its COMMIT returned on the primary.
	StandbyAck standby.Config
	// Logger receives the consumer's logs. Defaults to warnings and errors
	// on stderr (slog.New(slog.DiscardHandler) silences them).
	Logger *slog.Logger
	// Hooks observe batches and messages, for metrics and tracing.
	Hooks []Hook
}

func (c Config) withDefaults() Config {
	if c.Scope == "" {
		c.Scope = c.Name
	}
	if c.KeyFunc == nil {
		c.KeyFunc = DefaultKey
	}
	if c.MaxKeyLen == 0 {
		c.MaxKeyLen = dedupe.DefaultMaxIDLen
	}
	if c.BatchSize == 0 {
		c.BatchSize = defaultBatchSize
	}
	if c.Concurrency == 0 {
		c.Concurrency = defaultConcurrency
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = defaultMaxAttempts
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = defaultRetryBackoff
	}
	if c.MaxRetryBackoff == 0 {
		c.MaxRetryBackoff = defaultMaxRetryBackoff
	}
	if c.GapDelay == 0 {
		c.GapDelay = defaultGapDelay
	}
	if c.GapMaxAttempts == 0 {
		c.GapMaxAttempts = defaultGapMaxAttempts
	}
	if c.Schema == "" {
		c.Schema = pg.DefaultSchema
	}
	if c.ParkedTable == "" {
		c.ParkedTable = parked.DefaultTable
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = defaultShutdownTimeout
	}
	if c.IdleTxTimeout == 0 {
		c.IdleTxTimeout = defaultIdleTxTimeout
	}
	if c.StandbyAck.Standbys > 0 && c.StandbyAck.Timeout == 0 {
		c.StandbyAck.Timeout = standby.DefaultTimeout
	}
	if c.Logger == nil {
		c.Logger = logx.Default()
	}
	return c
}

func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return pg.ConfigErrorf("consumer", field, format, args...)
	}
	switch {
	case c.Name == "":
		return bad("Name", "is required")
	case c.Strategy == nil:
		return bad("Strategy", "is required")
	case c.handlers() == 0:
		return bad("Handler", "one of Handler, QueueHandler and BatchHandler is required")
	case c.handlers() > 1:
		return bad("Handler", "set only one of Handler, QueueHandler and BatchHandler")
	case c.MaxKeyLen < 0:
		return bad("MaxKeyLen", "must not be negative, got %d", c.MaxKeyLen)
	case c.BatchSize < 1 || c.BatchSize > MaxBatchSize:
		return bad("BatchSize", "must be between 1 and %d (0 for the default), got %d", MaxBatchSize, c.BatchSize)
	case c.Concurrency < 1:
		return bad("Concurrency", "must be at least 1 (0 for the default), got %d", c.Concurrency)
	case c.MaxAttempts < 1:
		return bad("MaxAttempts", "must be at least 1 (0 for the default), got %d", c.MaxAttempts)
	case c.GapMaxAttempts < 1:
		return bad("GapMaxAttempts", "must be at least 1 (0 for the default), got %d", c.GapMaxAttempts)
	case c.RetryBackoff < 0:
		return bad("RetryBackoff", "must not be negative, got %s", c.RetryBackoff)
	case c.MaxRetryBackoff < 0:
		return bad("MaxRetryBackoff", "must not be negative, got %s", c.MaxRetryBackoff)
	case c.GapDelay < 0:
		return bad("GapDelay", "must not be negative, got %s", c.GapDelay)
	case c.ShutdownTimeout < 0:
		return bad("ShutdownTimeout", "must not be negative, got %s", c.ShutdownTimeout)
	case c.SourceFailureTimeout < 0:
		return bad("SourceFailureTimeout", "must not be negative, got %s", c.SourceFailureTimeout)
	case c.IdleTxTimeout > 0 && c.IdleTxTimeout < time.Millisecond:
		return bad("IdleTxTimeout", "%s is shorter than PostgreSQL's resolution of 1ms", c.IdleTxTimeout)
	case c.StandbyAck.Standbys < 0:
		return bad("StandbyAck.Standbys", "must not be negative, got %d", c.StandbyAck.Standbys)
	case c.StandbyAck.Timeout < 0:
		return bad("StandbyAck.Timeout", "must not be negative, got %s", c.StandbyAck.Timeout)
	case c.StandbyAck.Standbys == 0 && (c.StandbyAck.Timeout != 0 || c.StandbyAck.Replayed):
		return bad("StandbyAck.Standbys", "is 0, so StandbyAck is off, but Timeout or Replayed is set: set Standbys to the number of standbys that must hold a commit")
	case c.OnMismatch > MismatchPark:
		return bad("OnMismatch", "unknown policy %d", c.OnMismatch)
	case c.Fingerprint > FingerprintJSON:
		return bad("Fingerprint", "unknown mode %d", c.Fingerprint)
	}
	if err := dedupe.Validate(dedupe.Key{Scope: c.Scope}, 0); err != nil {
		return bad("Scope", "%v", err)
	}
	return validateParkedTable(c.Schema, c.ParkedTable)
}

// handlers counts the handler shapes c sets.
func (c Config) handlers() int {
	n := 0
	for _, set := range []bool{c.Handler != nil, c.QueueHandler != nil, c.BatchHandler != nil} {
		if set {
			n++
		}
	}
	return n
}

// validateParkedTable checks the parked table's schema and name, leaving
// room for its indexes' names.
func validateParkedTable(schema, table string) error {
	if err := pg.ValidateIdentifier(schema, 0); err != nil {
		return pg.ConfigErrorf("consumer", "Schema", "%v", err)
	}
	if err := pg.ValidateIdentifier(table, parkedIndexReserve); err != nil {
		return pg.ConfigErrorf("consumer", "ParkedTable", "%v", err)
	}
	return nil
}
