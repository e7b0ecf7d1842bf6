package kafkatest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	kafka "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Settings for kafka-go clients in tests.
const (
	// MaxWait is the fetch MaxWait for readers.
	MaxWait = 100 * time.Millisecond
	// BatchTimeout is the Writer's BatchTimeout.
	BatchTimeout = 5 * time.Millisecond
	// SessionTimeout is a group session timeout every broker accepts.
	SessionTimeout = 6 * time.Second
	// HeartbeatInterval makes members notice rebalances quickly.
	HeartbeatInterval = 200 * time.Millisecond
)

// Cluster is a Kafka cluster for tests: an in-process kfake cluster, or the
// cluster named by KAFKA_BROKERS.
type Cluster struct {
	brokers []string
	fake    *kfake.Cluster
	client  *kafka.Client
	tls     *tls.Config
	sasl    sasl.Mechanism
	keeper  *keeper // the in-process cluster's session keeper (see sessions.go)
}

// Start starts an in-process single-broker kfake cluster with opts, unless
// KAFKA_BROKERS is set, in which case it returns that cluster (and ignores
// opts).
func Start(opts ...kfake.Opt) (*Cluster, error) {
	if env := os.Getenv("KAFKA_BROKERS"); env != "" {
		var brokers []string
		for _, b := range strings.Split(env, ",") {
			if b = strings.TrimSpace(b); b != "" {
				brokers = append(brokers, b)
			}
		}
		return newCluster(brokers, nil), nil
	}
	return StartFake(opts...)
}

// StartFake starts an in-process single-broker kfake cluster with opts,
// with a session keeper that expires group members as Kafka does (see
// LogSessions).
func StartFake(opts ...kfake.Opt) (*Cluster, error) {
	fake, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafkatest: start kfake: %w", err)
	}
	c := newCluster(fake.ListenAddrs(), fake)
	c.keeper = startKeeper(c.groupInfo, c.leaveGroup)
	for _, key := range []kmsg.Key{kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.OffsetCommit} {
		fake.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.keeper.observe(req)
			return nil, nil, false // observe only: kfake handles every request
		})
	}
	return c, nil
}

// groupInfo reads a group's state and members from the in-process cluster.
func (c *Cluster) groupInfo(group string) (state string, members []string, ok bool) {
	i := c.fake.GroupInfo(group)
	if i == nil {
		return "", nil, false
	}
	for _, m := range i.Members {
		members = append(members, m.MemberID)
	}
	return i.State, members, true
}

// leaveGroup removes member from group, with the helpers' TLS and SASL.
func (c *Cluster) leaveGroup(ctx context.Context, group, member string) error {
	resp, err := c.client.LeaveGroup(ctx, &kafka.LeaveGroupRequest{
		GroupID: group,
		Members: []kafka.LeaveGroupRequestMember{{ID: member}},
	})
	if err != nil {
		return err
	}
	if resp.Error != nil {
		return resp.Error
	}
	for _, m := range resp.Members {
		if m.Error != nil {
			return m.Error
		}
	}
	return nil
}

// LogSessions makes the in-process cluster report to w the group members
// it drops because their session expired where kfake alone would keep
// them (see sessions.go). It does nothing to a real cluster.
func (c *Cluster) LogSessions(w io.Writer) {
	if c.keeper != nil {
		c.keeper.setLog(w)
	}
}

func newCluster(brokers []string, fake *kfake.Cluster) *Cluster {
	return &Cluster{
		brokers: brokers,
		fake:    fake,
		client:  &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second, Transport: &kafka.Transport{}},
	}
}

// New starts a cluster for a test (see Start) and closes it when the test
// is done.
func New(tb testing.TB, opts ...kfake.Opt) *Cluster {
	tb.Helper()
	c, err := Start(opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// UseSASL makes the helpers (CreateTopic, Writer, Produce,
// CommittedOffsets) authenticate with m, for clusters started with
// kfake.EnableSASL.
func (c *Cluster) UseSASL(m sasl.Mechanism) {
	c.sasl = m
	c.resetTransport()
}

// UseTLS makes the helpers connect with TLS configured by cfg (see
// CA.ClientTLS), for clusters started with kfake.TLS.
func (c *Cluster) UseTLS(cfg *tls.Config) {
	c.tls = cfg
	c.resetTransport()
}

func (c *Cluster) resetTransport() {
	if t, ok := c.client.Transport.(*kafka.Transport); ok {
		t.CloseIdleConnections()
	}
	c.client.Transport = c.transport()
}

func (c *Cluster) transport() *kafka.Transport {
	return &kafka.Transport{TLS: c.tls, SASL: c.sasl}
}

// Brokers returns the cluster's bootstrap addresses.
func (c *Cluster) Brokers() []string { return c.brokers }

// Fake returns the in-process cluster, or nil when KAFKA_BROKERS is used.
func (c *Cluster) Fake() *kfake.Cluster { return c.fake }

// Close stops the in-process cluster; it does nothing to a real one.
func (c *Cluster) Close() {
	if c.keeper != nil {
		c.keeper.stop()
	}
	if t, ok := c.client.Transport.(*kafka.Transport); ok {
		t.CloseIdleConnections()
	}
	if c.fake != nil {
		c.fake.Close()
	}
}

// Name returns prefix followed by a random suffix, for topics and groups
// that must not collide with earlier runs on a real cluster.
func Name(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// CreateTopic creates topic with the given number of partitions and, if
// retention is not zero, that retention.ms.
func (c *Cluster) CreateTopic(ctx context.Context, topic string, partitions int, retention ...time.Duration) error {
	tc := kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}
	if len(retention) > 0 && retention[0] != 0 {
		tc.ConfigEntries = []kafka.ConfigEntry{{ConfigName: "retention.ms", ConfigValue: fmt.Sprint(retention[0].Milliseconds())}}
	}
	resp, err := c.client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{tc}})
	if err != nil {
		return fmt.Errorf("kafkatest: create topic %s: %w", topic, err)
	}
	if err := resp.Errors[topic]; err != nil {
		return fmt.Errorf("kafkatest: create topic %s: %w", topic, err)
	}
	return nil
}

// ToPartition is a kafka.Balancer that writes each message to the
// partition named by its Partition field.
var ToPartition kafka.Balancer = toPartition{}

type toPartition struct{}

func (toPartition) Balance(m kafka.Message, partitions ...int) int { return m.Partition }

// Writer returns a Writer for topic with test settings; messages go to the
// partition in their Partition field. Close it when done.
func (c *Cluster) Writer(topic string) *kafka.Writer {
	return &kafka.Writer{
		Addr:         kafka.TCP(c.brokers...),
		Topic:        topic,
		Balancer:     ToPartition,
		BatchTimeout: BatchTimeout,
		BatchSize:    1000,
		BatchBytes:   16 << 20,
		RequiredAcks: kafka.RequireAll,
		Transport:    c.transport(),
	}
}

// Produce writes msgs to topic, each to the partition in its Partition field.
func (c *Cluster) Produce(ctx context.Context, topic string, msgs ...kafka.Message) error {
	w := c.Writer(topic)
	defer w.Close()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("kafkatest: produce to %s: %w", topic, err)
	}
	return nil
}

// CommittedOffsets returns the offsets group committed to Kafka for topic,
// by partition; partitions without a commit are missing.
func (c *Cluster) CommittedOffsets(ctx context.Context, group, topic string) (map[int]int64, error) {
	offs, err := c.client.ConsumerOffsets(ctx, kafka.TopicAndGroup{Topic: topic, GroupId: group})
	if err != nil {
		return nil, fmt.Errorf("kafkatest: committed offsets of %s on %s: %w", group, topic, err)
	}
	out := make(map[int]int64, len(offs))
	for p, o := range offs {
		if o >= 0 {
			out[p] = o
		}
	}
	return out, nil
}
