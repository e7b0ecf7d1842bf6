package sqs

import (
	"log/slog"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/effectively-once/effectively/internal/logx"
	"github.com/effectively-once/effectively/pg"
)

// DefaultIDAttribute is the message attribute that carries a standard
// queue's dedupe ID unless Config.IDAttribute says otherwise.
const DefaultIDAttribute = "idempotency-key"

// Defaults of the other Config fields. HeartbeatInterval defaults to a
// third of VisibilityTimeout.
const (
	DefaultReceivers         = 4
	DefaultMaxMessages       = maxPerReceive
	DefaultWaitTime          = maxWait
	DefaultVisibilityTimeout = 30 * time.Second
	DefaultBufferSize        = 100
	DefaultGroupBatchSize    = 1
)

// Limits SQS puts on the values below.
const (
	maxPerReceive = 10
	maxWait       = 20 * time.Second
	maxVisibility = 12 * time.Hour
)

// Config configures a Source. Only one of QueueURL and QueueName is required;
// every other field's zero value is a usable default.
type Config struct {
	// QueueURL is the queue's URL. Either it or QueueName is required.
	QueueURL string
	// QueueName is the queue's name, looked up with GetQueueUrl when
	// QueueURL is empty.
	QueueName string

	// Client is the SQS client to use. Defaults to a client built from the
	// AWS default configuration chain (environment, shared config and
	// credentials files, instance roles), with Region and Endpoint applied.
	Client *sqs.Client
	// Region overrides the region of the default configuration chain. Only
	// used when Client is nil. Defaults to the chain's region, which must then
	// be set.
	Region string
	// Endpoint overrides the SQS endpoint (the SDK's BaseEndpoint), for an
	// emulator or a VPC endpoint. Only used when Client is nil. Defaults to
	// the region's public endpoint.
	Endpoint string

	// Receivers is how many goroutines long-poll the queue at once. On a
	// standard queue each receiver is one lane. Defaults to 4
	// (DefaultReceivers).
	Receivers int
	// MaxMessages is the most messages one ReceiveMessage call asks for,
	// between 1 and 10. Defaults to 10 (DefaultMaxMessages).
	MaxMessages int
	// WaitTime is the long-polling wait of one ReceiveMessage call, in whole
	// seconds from 1s to 20s. Close waits for the polls in progress, so it
	// can take this long. Defaults to 20s (DefaultWaitTime).
	WaitTime time.Duration
	// VisibilityTimeout is asked for on every receive and renewed by the
	// heartbeat while the source holds a message: how long a message stays
	// hidden from other workers if this one stops heartbeating (crashes).
	// Whole seconds between 1s and 12h. Defaults to 30s
	// (DefaultVisibilityTimeout).
	VisibilityTimeout time.Duration
	// HeartbeatInterval is how often the visibility of held messages is
	// renewed. It must be shorter than VisibilityTimeout, with room for a
	// round trip. Defaults to a third of VisibilityTimeout.
	HeartbeatInterval time.Duration
	// BufferSize is the most received messages one receiver holds before the
	// consumer fetches them (on a FIFO queue, the receivers share one buffer
	// of Receivers × BufferSize); a receiver pauses while it is full. Held
	// messages are kept invisible by the heartbeat. Defaults to 100
	// (DefaultBufferSize).
	BufferSize int

	// GroupBatchSize caps how many messages of one FIFO message group a
	// batch holds. The consumer acknowledges the messages of a batch that
	// succeeded even when an earlier one of the same group is retried, so
	// only 1 keeps a group's order strict across retries. Larger values make
	// fewer, bigger transactions for busy groups and keep order as long as no
	// message fails. Defaults to 1 (DefaultGroupBatchSize).
	GroupBatchSize int

	// IDAttribute is the message attribute whose value is the default dedupe
	// ID on a standard queue. A message without it falls back to its SQS
	// MessageId, which only recognises redeliveries of the same SQS message,
	// not a producer sending the same thing twice. Defaults to
	// "idempotency-key". FIFO queues use the MessageDeduplicationId.
	IDAttribute string
	// RequireIDAttribute makes a standard-queue message without IDAttribute
	// (or with an empty one) unreadable instead of falling back to the
	// MessageId: it is parked with the reason when the consumer's KeyFunc is
	// wrapped with ParkUnreadable. Defaults to false.
	RequireIDAttribute bool
	// SNSEnvelope unwraps SNS notifications (SNS to SQS subscriptions without
	// raw message delivery): Message.Value is the notification's Message, the
	// headers include its MessageAttributes, and the default dedupe ID on a
	// standard queue is the IDAttribute among those, else the SNS MessageId.
	// A body that is not an SNS envelope is unreadable (see ParkUnreadable).
	// Defaults to false.
	SNSEnvelope bool

	// UseQueueRedrive leaves messages whose attempts are used up to the
	// queue's redrive policy (its dead-letter queue) rather than to the
	// consumer, which would park them in Postgres. It requires the queue to
	// have a RedrivePolicy. The consumer then never parks a message for
	// running out of attempts (the source reports this through
	// consumer.ExhaustionSource); it keeps handing the message back until
	// SQS moves it. Permanent failures are still parked. Defaults to false:
	// the consumer parks exhausted messages and they are deleted.
	UseQueueRedrive bool

	// Logger receives the source's logs. Defaults to warnings and errors on
	// stderr, so that a wrong address or a missing queue is seen.
	Logger *slog.Logger
}

// ErrInvalidConfig is matched by every error New returns for a bad Config.
// It is pg.ErrInvalidConfig, so consumer.ErrInvalidConfig matches them
// too.
var ErrInvalidConfig = pg.ErrInvalidConfig

// ConfigError reports a bad Config value, with Package "sqs". It is the
// library's one configuration error, pg.ConfigError.
type ConfigError = pg.ConfigError

func (c Config) withDefaults() Config {
	if c.Receivers == 0 {
		c.Receivers = DefaultReceivers
	}
	if c.MaxMessages == 0 {
		c.MaxMessages = DefaultMaxMessages
	}
	if c.WaitTime == 0 {
		c.WaitTime = DefaultWaitTime
	}
	if c.VisibilityTimeout == 0 {
		c.VisibilityTimeout = DefaultVisibilityTimeout
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = c.VisibilityTimeout / 3
	}
	if c.BufferSize == 0 {
		c.BufferSize = DefaultBufferSize
	}
	if c.GroupBatchSize == 0 {
		c.GroupBatchSize = DefaultGroupBatchSize
	}
	if c.IDAttribute == "" {
		c.IDAttribute = DefaultIDAttribute
	}
	if c.Logger == nil {
		c.Logger = logx.Default()
	}
	return c
}

// minHeartbeatMargin is the least time a heartbeat leaves between its
// renewal and the visibility deadline, for the round trip.
const minHeartbeatMargin = 500 * time.Millisecond

func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return pg.ConfigErrorf("sqs", field, format, args...)
	}
	whole := func(d time.Duration) bool { return d%time.Second == 0 }
	switch {
	case c.QueueURL == "" && c.QueueName == "":
		return bad("QueueURL", "one of QueueURL and QueueName is required")
	case c.QueueURL != "" && c.QueueName != "":
		return bad("QueueURL", "set only one of QueueURL and QueueName")
	case c.QueueURL != "" && !strings.Contains(c.QueueURL, "://"):
		return bad("QueueURL", "%q is not a URL (did you mean QueueName?)", c.QueueURL)
	case c.Client != nil && (c.Region != "" || c.Endpoint != ""):
		return bad("Client", "Region and Endpoint only apply when Client is nil; configure the client instead")
	case c.Endpoint != "" && !strings.Contains(c.Endpoint, "://"):
		return bad("Endpoint", "%q is not a URL such as http://localhost:4566", c.Endpoint)
	case c.Receivers < 0:
		return bad("Receivers", "must be at least 1 (0 for the default), got %d", c.Receivers)
	case c.MaxMessages < 0 || c.MaxMessages > maxPerReceive:
		return bad("MaxMessages", "must be between 1 and %d (0 for the default), got %d", maxPerReceive, c.MaxMessages)
	case c.WaitTime < time.Second || c.WaitTime > maxWait || !whole(c.WaitTime):
		return bad("WaitTime", "must be whole seconds from 1s to %s, got %s", maxWait, c.WaitTime)
	case c.VisibilityTimeout < time.Second || c.VisibilityTimeout > maxVisibility || !whole(c.VisibilityTimeout):
		return bad("VisibilityTimeout", "must be whole seconds from 1s to %s, got %s", maxVisibility, c.VisibilityTimeout)
	case c.HeartbeatInterval <= 0:
		return bad("HeartbeatInterval", "must be positive (0 for the default), got %s", c.HeartbeatInterval)
	case c.HeartbeatInterval > c.VisibilityTimeout-minHeartbeatMargin:
		return bad("HeartbeatInterval", "%s cannot beat the visibility timeout of %s: it must be shorter by at least %s, so a renewal arrives before messages become visible again",
			c.HeartbeatInterval, c.VisibilityTimeout, minHeartbeatMargin)
	case c.GroupBatchSize < 0:
		return bad("GroupBatchSize", "must be at least 1 (0 for the default), got %d", c.GroupBatchSize)
	case c.BufferSize < 0:
		return bad("BufferSize", "must be at least 1 (0 for the default), got %d", c.BufferSize)
	}
	return nil
}
