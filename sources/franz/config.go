package franz

import (
	"log/slog"
	"strings"
	"time"

	"github.com/effectively-once/effectively/internal/logx"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultIDHeader is the header whose value becomes Message.ID unless
// Config.IDHeader names another one: the same as sources/kafka's.
const DefaultIDHeader = kafka.DefaultIDHeader

// Defaults of the other Config fields.
const (
	DefaultPartitionBuffer = 1000
	DefaultSchema          = pg.DefaultSchema
	// DefaultOffsetsTable is sources/kafka's table: both sources keep
	// their positions in it, with the same rows and the same fencing.
	DefaultOffsetsTable = kafka.DefaultOffsetsTable
	// DefaultClientID is the client ID sent to the brokers unless
	// Config.Opts sets one (kgo.ClientID).
	DefaultClientID = kafka.DefaultClientID
)

// Config configures a Source. Brokers, Group and Topics are required; every
// other field's zero value is a usable default.
type Config struct {
	// Brokers are the bootstrap addresses ("host:port") of the cluster
	// (kgo.SeedBrokers). Required.
	Brokers []string
	// Group is the Kafka consumer group. Required.
	Group string
	// Topics are the topics the group consumes. Required.
	Topics []string

	// InstanceID makes the source a static member of the group (KIP-345,
	// kgo.InstanceID): give each process of the group its own, stable
	// across restarts (a pod's name in a StatefulSet, a slot number).
	// A process killed without closing (kill -9, a crash) and restarted
	// with the same InstanceID takes its member's place at once, without
	// waiting for the session timeout; the coordinator fences the member
	// it replaces, and a fenced source stops (Fetch returns a permanent
	// error matching ErrFencedInstance) rather than rejoining and fencing
	// its replacement in turn. Close leaves the group all the same
	// (static members do not by Kafka's default), so that the others take
	// the partitions over at once. At most 249 characters of
	// [a-zA-Z0-9._-]. Defaults to "": a dynamic member, which a killed
	// process keeps in the group until its session times out. Setting
	// kgo.InstanceID in Opts does the same; the two must not differ.
	InstanceID string

	// Opts are the user's own franz-go options, for everything kgo
	// configures: TLS (kgo.DialTLSConfig, kgo.Dialer), SASL (kgo.SASL with
	// franz-go's pkg/sasl mechanisms), kgo.ClientID, the group's timings
	// (kgo.SessionTimeout, kgo.HeartbeatInterval, kgo.RebalanceTimeout),
	// kgo.Balancers, kgo.InstanceID for static membership,
	// kgo.ConsumeResetOffset for where a partition without any stored
	// offset starts, fetch sizes and waits (kgo.FetchMaxWait,
	// kgo.FetchMaxBytes), kgo.WithLogger, kgo.WithHooks (franz-go's kprom
	// and kotel plugins). They are applied after the source's defaults
	// (read-committed isolation, ClientID "effectively") and before the
	// options the source cannot do without, which override them: the
	// group, its topics, DisableAutoCommit, and the rebalance callbacks
	// (OnPartitionsAssigned, OnPartitionsRevoked, OnPartitionsLost,
	// OnOffsetsFetched, AdjustFetchOffsetsFn). Defaults to none: franz-go's
	// own defaults (a 45s session timeout, a 60s rebalance timeout, the
	// cooperative-sticky balancer, partitions with no offset start at the
	// beginning of the log).
	Opts []kgo.Opt

	// ReadUncommitted also delivers the records of transactions that were
	// aborted or are still open. Defaults to false: read-committed, only
	// records of committed transactions and of producers without
	// transactions are delivered (franz-go drops the aborted ones and the
	// control records). An Opts entry kgo.FetchIsolationLevel contradicts it
	// and is refused.
	ReadUncommitted bool
	// PartitionBuffer is how many fetched messages are held per partition
	// ahead of the consumer; a partition holding that many is paused
	// (kgo's PauseFetchPartitions) until the consumer took half of them.
	// Defaults to 1000 (DefaultPartitionBuffer).
	PartitionBuffer int
	// RevokeTimeout is how long in-flight batches of revoked partitions may
	// still commit when a rebalance starts; after it they are abandoned
	// and their commit is refused (consumer.ErrFenced). It must be shorter
	// than the group's rebalance timeout (kgo.RebalanceTimeout, 60s by
	// default). Defaults to the smaller of 10s and half of the rebalance
	// timeout.
	RevokeTimeout time.Duration

	// IDHeader names the header whose value is the message's default dedupe
	// ID (Message.ID). Messages without it, or with an empty value, get
	// "topic/partition/offset". Defaults to DefaultIDHeader.
	IDHeader string

	// KafkaOffsetsOnly turns off the offsets table: positions come only
	// from offsets committed to Kafka after each transaction, there is no
	// fencing of consumers whose generation ended, and redeliveries are
	// left to the dedupe strategy. Defaults to false: offsets are kept in
	// Postgres.
	KafkaOffsetsOnly bool
	// Schema holds the offsets table. Defaults to "effectively"
	// (DefaultSchema).
	Schema string
	// OffsetsTable is the offsets table's name. Defaults to
	// "kafka_offsets" (DefaultOffsetsTable), the table sources/kafka
	// keeps: a group can move from one source to the other and keep its
	// positions.
	OffsetsTable string

	// Logger receives the source's logs. Defaults to warnings and errors
	// on stderr, so that a wrong address or a missing table is seen.
	// franz-go's own logs go where kgo.WithLogger in Opts sends them.
	Logger *slog.Logger
}

// ErrInvalidConfig is matched by every error New returns for a bad Config.
// It is pg.ErrInvalidConfig, so consumer.ErrInvalidConfig matches them
// too.
var ErrInvalidConfig = pg.ErrInvalidConfig

func (c Config) withDefaults() Config {
	if c.PartitionBuffer == 0 {
		c.PartitionBuffer = DefaultPartitionBuffer
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
	return c
}

func bad(field, format string, args ...any) error {
	return pg.ConfigErrorf("franz", field, format, args...)
}

// instanceIDChars are the characters Kafka allows in a group instance ID.
const instanceIDChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

func (c Config) validate() error {
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
	case c.PartitionBuffer < 0:
		return bad("PartitionBuffer", "must not be negative, got %d", c.PartitionBuffer)
	case c.RevokeTimeout < 0:
		return bad("RevokeTimeout", "must not be negative, got %s", c.RevokeTimeout)
	}
	if len(c.InstanceID) > 249 || strings.Trim(c.InstanceID, instanceIDChars) != "" {
		return bad("InstanceID", "%q: at most 249 characters of [a-zA-Z0-9._-]", c.InstanceID)
	}
	if err := pg.ValidateIdentifier(c.Schema, 0); err != nil {
		return bad("Schema", "%v", err)
	}
	if err := pg.ValidateIdentifier(c.OffsetsTable, 0); err != nil {
		return bad("OffsetsTable", "%v", err)
	}
	return nil
}
