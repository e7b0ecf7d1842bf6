package kafka

import (
	"context"
	"crypto/tls"
	"log/slog"
	"strings"
	"time"

	"github.com/effectively-once/effectively/internal/logx"
	"github.com/effectively-once/effectively/pg"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
)

// DefaultIDHeader is the header whose value becomes Message.ID unless
// Config.IDHeader names another one.
const DefaultIDHeader = "idempotency-key"

// Defaults of the other Config fields. HeartbeatInterval and RevokeTimeout
// default to values derived from SessionTimeout and RebalanceTimeout.
const (
	DefaultClientID         = "effectively"
	DefaultDialTimeout      = 10 * time.Second
	DefaultStartOffset      = kafkago.FirstOffset
	DefaultMinBytes         = 1
	DefaultMaxBytes         = 1 << 20
	DefaultMaxWait          = 500 * time.Millisecond
	DefaultPartitionBuffer  = 1000
	DefaultSessionTimeout   = 10 * time.Second
	DefaultRebalanceTimeout = 30 * time.Second
	DefaultJoinGroupBackoff = 5 * time.Second
	DefaultMetadataInterval = 10 * time.Second
	DefaultSchema           = pg.DefaultSchema
	DefaultOffsetsTable     = "kafka_offsets"
)

// Config configures a Source. Brokers, Group and Topics are required; every
// other field's zero value is a usable default.
type Config struct {
	// Brokers are the bootstrap addresses ("host:port") of the cluster. Required.
	Brokers []string
	// Group is the Kafka consumer group. Required.
	Group string
	// Topics are the topics the group consumes. Required.
	Topics []string

	// TLS, when set, makes every connection to the brokers (the group
	// coordinator, the partition fetches, the retention lookup) use TLS:
	// RootCAs holds the CA that signed the brokers' certificates (nil for
	// the system's roots), Certificates the client certificate for mutual
	// TLS, and ServerName, when empty, is each broker's host name. The
	// source does not modify it. Defaults to nil: plaintext connections.
	TLS *tls.Config
	// SASL, when set, authenticates every connection after the TLS
	// handshake: SASLMechanism makes PLAIN, SCRAM-SHA-256 and
	// SCRAM-SHA-512 mechanisms; any other kafka-go sasl.Mechanism
	// (sasl/aws_msk_iam_v2, say) works too. PLAIN sends the password as it
	// is: use it with TLS. Refused credentials or certificates stop the
	// consumer (see ErrAuthentication). Defaults to nil: no authentication.
	SASL sasl.Mechanism
	// ClientID is sent to the brokers. Defaults to "effectively"
	// (DefaultClientID).
	ClientID string
	// DialTimeout bounds connecting to a broker. Defaults to 10s
	// (DefaultDialTimeout).
	DialTimeout time.Duration

	// StartOffset is where a partition starts when neither Postgres nor
	// Kafka holds an offset for the group: kafkago.FirstOffset (-2) or
	// kafkago.LastOffset (-1). Defaults to kafkago.FirstOffset.
	StartOffset int64
	// MinBytes is the least data a fetch waits for. Defaults to 1
	// (DefaultMinBytes).
	MinBytes int
	// MaxBytes is the most data one fetch returns per partition. Defaults to
	// 1 MiB (DefaultMaxBytes).
	MaxBytes int
	// MaxWait is how long a fetch waits for MinBytes. Defaults to 500ms
	// (DefaultMaxWait).
	MaxWait time.Duration
	// ReadUncommitted also delivers the records of transactions that were
	// aborted or are still open. Defaults to false: read-committed, only
	// records of committed transactions and of producers without
	// transactions are delivered (see "Transactions" in the package
	// documentation). Control records are never delivered.
	ReadUncommitted bool
	// ReadCommitted is the default isolation.
	//
	// Deprecated: reading committed records is the default; setting this
	// has no effect beyond that. Use ReadUncommitted for the other level.
	ReadCommitted bool
	// PartitionBuffer is how many fetched messages are held per partition
	// ahead of the consumer. Defaults to 1000 (DefaultPartitionBuffer).
	PartitionBuffer int

	// SessionTimeout is how long the coordinator waits for a heartbeat
	// before it considers a member dead and gives its partitions to the
	// others: the partitions of a worker that died without leaving the
	// group (kill -9, a crash, a lost host) stall for about that long. A
	// shorter one fails over sooner, but a member whose heartbeats stop for
	// longer (a stopped process, a GC or scheduling pause, a network
	// hiccup) is dropped and its partitions move, a rebalance that costs
	// the whole group up to RevokeTimeout. Brokers refuse values outside
	// group.min.session.timeout.ms and group.max.session.timeout.ms (6s and
	// 30 minutes by default). Defaults to 10s (DefaultSessionTimeout).
	SessionTimeout time.Duration
	// HeartbeatInterval is the time between heartbeats; a member notices a
	// rebalance on its next heartbeat, so every rebalance takes at least
	// that long. Heartbeats are small requests to the group's coordinator.
	// Defaults to the smaller of 1s and a third of SessionTimeout.
	HeartbeatInterval time.Duration
	// RebalanceTimeout is how long the coordinator waits for members to
	// rejoin during a rebalance; a member that does not rejoin in time (it
	// still waits for its batches, see RevokeTimeout) is dropped from the
	// group. It bounds a rebalance only when a member fails to rejoin: live
	// members rejoin after their in-flight batches settled. Defaults to 30s
	// (DefaultRebalanceTimeout).
	RebalanceTimeout time.Duration
	// RevokeTimeout is how long in-flight batches of revoked partitions may
	// still commit when a rebalance starts; after it they are abandoned and
	// their commit is refused (consumer.ErrFenced). It must be shorter than
	// RebalanceTimeout. Defaults to the smaller of 10s and half of RebalanceTimeout.
	RevokeTimeout time.Duration
	// Pipeline hands out a partition's next batch while its last one
	// commits, to a consumer goroutine that is free (consumer.Config's
	// Concurrency above the number of busy partitions): it claims its keys
	// meanwhile and runs its handlers once the last one was settled (see
	// "Pipelined partitions" in the package doc). It has not been shown to
	// lower latency on a loaded 2-core machine (BENCHMARKS.md). Defaults to
	// false: one batch per partition at a time.
	Pipeline bool
	// JoinGroupBackoff is the wait before rejoining the group after an
	// error. Defaults to 5s (DefaultJoinGroupBackoff).
	JoinGroupBackoff time.Duration

	// MetadataInterval is how often the source reads the metadata of
	// Topics, to notice a topic created or deleted and partitions added:
	// the member that computes the group's assignment rejoins the group when
	// they changed, so new partitions are consumed within about
	// MetadataInterval plus a rebalance. A topic that does not exist is
	// logged as a warning naming it, and the other topics are consumed
	// meanwhile. Defaults to 10s (DefaultMetadataInterval).
	MetadataInterval time.Duration

	// OnAssigned, when set, is called with the partitions a generation
	// claimed, after the claim in Postgres and before any batch of them is
	// handed out. Partitions whose offsets row was locked at the claim are
	// reported in a later call, once claimed. ctx is done when the
	// generation ends. It must return promptly: the partitions are not
	// read until it returns.
	OnAssigned func(ctx context.Context, partitions []TopicPartition)
	// OnRevoked, when set, is called with the partitions OnAssigned
	// reported for a generation, once that generation ended and their
	// in-flight batches committed or were abandoned (see RevokeTimeout),
	// and before this member rejoins the group, so before another member
	// is given them in an orderly rebalance. A member dropped by the
	// coordinator (it did not rejoin in time) may be called after another
	// member took the partitions over; the Postgres fence keeps its
	// batches from committing then. ctx expires after RevokeTimeout. It
	// is called on Close too.
	OnRevoked func(ctx context.Context, partitions []TopicPartition)

	// IDHeader names the header whose value is the message's default dedupe
	// ID (Message.ID). Messages without it, or with an empty value, get
	// "topic/partition/offset". Defaults to DefaultIDHeader.
	IDHeader string

	// KafkaOffsetsOnly turns off the offsets table: positions come only from
	// offsets committed to Kafka after each transaction, there is no
	// fencing of consumers whose generation ended, and redeliveries are left
	// to the dedupe strategy. Defaults to false: offsets are kept in Postgres.
	KafkaOffsetsOnly bool
	// Schema holds the offsets table. Defaults to "effectively"
	// (DefaultSchema).
	Schema string
	// OffsetsTable is the offsets table's name. Defaults to "kafka_offsets"
	// (DefaultOffsetsTable).
	OffsetsTable string

	// Routing, when set, makes this source one of several in Group, each
	// with its own database, and gives it only the partitions that
	// Routing.Route sends to its database (see Routing). Defaults to nil:
	// every partition may be assigned to this source.
	Routing *Routing

	// Logger receives the source's logs. Defaults to warnings and errors on
	// stderr, so that a wrong address or a missing queue is seen.
	Logger *slog.Logger
}

// ErrInvalidConfig is matched by every error New returns for a bad Config.
// It is pg.ErrInvalidConfig, so consumer.ErrInvalidConfig matches them
// too.
var ErrInvalidConfig = pg.ErrInvalidConfig

// ConfigError reports a bad Config value, with Package "kafka". It is the
// library's one configuration error, pg.ConfigError.
type ConfigError = pg.ConfigError

func (c Config) withDefaults() Config {
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.StartOffset == 0 {
		c.StartOffset = DefaultStartOffset
	}
	if c.MinBytes == 0 {
		c.MinBytes = DefaultMinBytes
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.MaxWait == 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.PartitionBuffer == 0 {
		c.PartitionBuffer = DefaultPartitionBuffer
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = min(time.Second, c.SessionTimeout/3)
	}
	if c.RebalanceTimeout == 0 {
		c.RebalanceTimeout = DefaultRebalanceTimeout
	}
	if c.RevokeTimeout == 0 {
		c.RevokeTimeout = min(10*time.Second, c.RebalanceTimeout/2)
	}
	if c.JoinGroupBackoff == 0 {
		c.JoinGroupBackoff = DefaultJoinGroupBackoff
	}
	if c.MetadataInterval == 0 {
		c.MetadataInterval = DefaultMetadataInterval
	}
	if c.IDHeader == "" {
		c.IDHeader = DefaultIDHeader
	}
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.OffsetsTable == "" {
		c.OffsetsTable = DefaultOffsetsTable
	}
	if c.Logger == nil {
		c.Logger = logx.Default()
	}
	if c.Routing != nil {
		r := *c.Routing // the source's own copy
		c.Routing = &r
	}
	return c
}

func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return pg.ConfigErrorf("kafka", field, format, args...)
	}
	if len(c.Brokers) == 0 {
		return bad("Brokers", "at least one broker address is required")
	}
	for i, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			return bad("Brokers", "address %d is empty", i)
		}
	}
	if c.Group == "" {
		return bad("Group", "is required")
	}
	if len(c.Topics) == 0 {
		return bad("Topics", "at least one topic is required")
	}
	seen := make(map[string]bool, len(c.Topics))
	for _, t := range c.Topics {
		switch {
		case t == "":
			return bad("Topics", "a topic name is empty")
		case len(t) > 249:
			return bad("Topics", "topic %q is longer than 249 characters", t)
		case strings.ContainsAny(t, "/ \t\n"):
			return bad("Topics", "topic %q contains a character Kafka does not allow", t)
		case seen[t]:
			return bad("Topics", "topic %q is listed twice", t)
		}
		seen[t] = true
	}
	switch {
	case c.DialTimeout < 0:
		return bad("DialTimeout", "must not be negative, got %s", c.DialTimeout)
	case c.StartOffset != kafkago.FirstOffset && c.StartOffset != kafkago.LastOffset:
		return bad("StartOffset", "must be kafka.FirstOffset (-2) or kafka.LastOffset (-1), got %d", c.StartOffset)
	case c.MinBytes < 0:
		return bad("MinBytes", "must not be negative, got %d", c.MinBytes)
	case c.MaxBytes < 0:
		return bad("MaxBytes", "must not be negative, got %d", c.MaxBytes)
	case c.MinBytes > c.MaxBytes:
		return bad("MinBytes", "%d is more than MaxBytes %d", c.MinBytes, c.MaxBytes)
	case c.MaxWait < 0:
		return bad("MaxWait", "must not be negative, got %s", c.MaxWait)
	case c.ReadCommitted && c.ReadUncommitted:
		return bad("ReadUncommitted", "contradicts ReadCommitted (which is the default and can be left out)")
	case c.PartitionBuffer < 0:
		return bad("PartitionBuffer", "must not be negative, got %d", c.PartitionBuffer)
	case c.SessionTimeout < 0:
		return bad("SessionTimeout", "must not be negative, got %s", c.SessionTimeout)
	case c.HeartbeatInterval < 0:
		return bad("HeartbeatInterval", "must not be negative, got %s", c.HeartbeatInterval)
	case c.HeartbeatInterval >= c.SessionTimeout:
		return bad("HeartbeatInterval", "%s must be shorter than SessionTimeout %s", c.HeartbeatInterval, c.SessionTimeout)
	case c.RebalanceTimeout < 0:
		return bad("RebalanceTimeout", "must not be negative, got %s", c.RebalanceTimeout)
	case c.RevokeTimeout < 0:
		return bad("RevokeTimeout", "must not be negative, got %s", c.RevokeTimeout)
	case c.RevokeTimeout >= c.RebalanceTimeout:
		return bad("RevokeTimeout", "%s must be shorter than RebalanceTimeout %s, or the coordinator drops the member before its batches finish", c.RevokeTimeout, c.RebalanceTimeout)
	case c.JoinGroupBackoff < 0:
		return bad("JoinGroupBackoff", "must not be negative, got %s", c.JoinGroupBackoff)
	case c.MetadataInterval < 0:
		return bad("MetadataInterval", "must not be negative, got %s", c.MetadataInterval)
	}
	if c.Routing != nil {
		if err := c.Routing.validate(); err != nil {
			return err
		}
	}
	if err := pg.ValidateIdentifier(c.Schema, 0); err != nil {
		return bad("Schema", "%v", err)
	}
	if err := pg.ValidateIdentifier(c.OffsetsTable, 0); err != nil {
		return bad("OffsetsTable", "%v", err)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"SessionTimeout", c.SessionTimeout}, {"RebalanceTimeout", c.RebalanceTimeout}, {"HeartbeatInterval", c.HeartbeatInterval}} {
		if d.v/time.Millisecond >= 1<<31-1 {
			return bad(d.name, "%s is too long", d.v)
		}
	}
	return nil
}
