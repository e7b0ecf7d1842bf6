package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/effectively-once/effectively/sources/kafka"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
)

// kafkaClient is the tool's connection to the brokers.
type kafkaClient struct {
	brokers []string
	c       *kafkago.Client
	tls     *tls.Config
	sasl    sasl.Mechanism
}

// newKafkaClient connects to the brokers with the connection flags' TLS and
// SASL settings, and checks that one of them accepts the connection.
func newKafkaClient(ctx context.Context, brokers []string, conn *kafkaConn, stderr io.Writer) (*kafkaClient, error) {
	var bs []string
	for _, b := range brokers {
		for _, p := range strings.Split(b, ",") {
			if p = strings.TrimSpace(p); p != "" {
				bs = append(bs, p)
			}
		}
	}
	if len(bs) == 0 {
		return nil, errors.New("--brokers: no broker address given")
	}
	tc, err := conn.tlsConfig(stderr)
	if err != nil {
		return nil, err
	}
	mech, err := conn.mechanism(tc != nil, stderr)
	if err != nil {
		return nil, err
	}
	k := &kafkaClient{brokers: bs, tls: tc, sasl: mech, c: &kafkago.Client{
		Addr:      kafkago.TCP(bs...),
		Timeout:   30 * time.Second,
		Transport: &kafkago.Transport{ClientID: "effectively-cli", TLS: tc, SASL: mech, DialTimeout: 10 * time.Second},
	}}
	if err := k.ping(ctx); err != nil {
		return nil, err
	}
	return k, nil
}

func (k *kafkaClient) dialer() *kafkago.Dialer {
	return &kafkago.Dialer{ClientID: "effectively-cli", Timeout: 10 * time.Second, DualStack: true, TLS: k.tls, SASLMechanism: k.sasl}
}

// ping connects to the brokers in turn until one accepts the connection
// (TLS handshake and SASL authentication included), and otherwise returns
// why none did. kafka-go's Dialer reports a broker that ends the SASL
// exchange by closing the connection as a failed authentication, where its
// Client only sees an unexpected EOF: this check gives a wrong password
// its name before the Client is used.
func (k *kafkaClient) ping(ctx context.Context) error {
	d := k.dialer()
	var errs []error
	for _, b := range k.brokers {
		c, err := d.DialContext(ctx, "tcp", b)
		if err == nil {
			_ = c.Close()
			return nil
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("kafka: cannot connect to the brokers: %w", errors.Join(errs...))
}

func (k *kafkaClient) close() {
	if t, ok := k.c.Transport.(*kafkago.Transport); ok {
		t.CloseIdleConnections()
	}
}

// partitions returns the partition numbers of topic, sorted.
func (k *kafkaClient) partitions(ctx context.Context, topic string) ([]int, error) {
	md, err := k.c.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("kafka: metadata of %s: %w", topic, err)
	}
	for _, t := range md.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return nil, fmt.Errorf("kafka: topic %s: %w", topic, t.Error)
		}
		ps := make([]int, 0, len(t.Partitions))
		for _, p := range t.Partitions {
			ps = append(ps, p.ID)
		}
		sort.Ints(ps)
		if len(ps) == 0 {
			return nil, fmt.Errorf("kafka: topic %s has no partitions", topic)
		}
		return ps, nil
	}
	return nil, fmt.Errorf("kafka: topic %s not found", topic)
}

// bounds returns the first and end (next to be written) offsets of parts.
func (k *kafkaClient) bounds(ctx context.Context, topic string, parts []int) (first, end map[int]int64, err error) {
	first, err = k.listOffsets(ctx, topic, parts, func(p int) kafkago.OffsetRequest { return kafkago.FirstOffsetOf(p) },
		func(po kafkago.PartitionOffsets) int64 { return po.FirstOffset })
	if err != nil {
		return nil, nil, err
	}
	end, err = k.listOffsets(ctx, topic, parts, func(p int) kafkago.OffsetRequest { return kafkago.LastOffsetOf(p) },
		func(po kafkago.PartitionOffsets) int64 { return po.LastOffset })
	return first, end, err
}

// offsetsAt returns, per partition, the first offset whose record time is at
// or after t; partitions with no such record get their end offset.
func (k *kafkaClient) offsetsAt(ctx context.Context, topic string, parts []int, t time.Time, end map[int]int64) (map[int]int64, error) {
	return k.listOffsets(ctx, topic, parts, func(p int) kafkago.OffsetRequest { return kafkago.TimeOffsetOf(p, t) },
		func(po kafkago.PartitionOffsets) int64 {
			for off := range po.Offsets {
				if off >= 0 {
					return off
				}
			}
			return end[po.Partition]
		})
}

func (k *kafkaClient) listOffsets(ctx context.Context, topic string, parts []int, req func(int) kafkago.OffsetRequest, pick func(kafkago.PartitionOffsets) int64) (map[int]int64, error) {
	reqs := make([]kafkago.OffsetRequest, len(parts))
	for i, p := range parts {
		reqs[i] = req(p)
	}
	resp, err := k.c.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("kafka: list offsets of %s: %w", topic, err)
	}
	out := make(map[int]int64, len(parts))
	for _, po := range resp.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("kafka: list offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		out[po.Partition] = pick(po)
	}
	for _, p := range parts {
		if _, ok := out[p]; !ok {
			return nil, fmt.Errorf("kafka: no offsets returned for %s/%d", topic, p)
		}
	}
	return out, nil
}

// groupMembers returns the state of group and how many members it has.
func (k *kafkaClient) groupMembers(ctx context.Context, group string) (state string, members int, err error) {
	resp, err := k.c.DescribeGroups(ctx, &kafkago.DescribeGroupsRequest{GroupIDs: []string{group}})
	if err != nil {
		return "", 0, fmt.Errorf("kafka: describe group %s: %w", group, err)
	}
	for _, g := range resp.Groups {
		if g.GroupID != group {
			continue
		}
		if g.Error != nil && !errors.Is(g.Error, kafkago.GroupIdNotFound) {
			return "", 0, fmt.Errorf("kafka: describe group %s: %w", group, g.Error)
		}
		return g.GroupState, len(g.Members), nil
	}
	return "Dead", 0, nil
}

// committed returns how many of parts have an offset that group committed
// to Kafka.
func (k *kafkaClient) committed(ctx context.Context, group, topic string, parts []int) (int, error) {
	resp, err := k.c.OffsetFetch(ctx, &kafkago.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return 0, fmt.Errorf("kafka: offsets committed by group %s: %w", group, err)
	}
	if errors.Is(resp.Error, kafkago.GroupIdNotFound) {
		return 0, nil
	}
	if resp.Error != nil {
		return 0, fmt.Errorf("kafka: offsets committed by group %s: %w", group, resp.Error)
	}
	n := 0
	for _, p := range resp.Topics[topic] {
		if p.Error == nil && p.CommittedOffset >= 0 {
			n++
		}
	}
	return n, nil
}

// sourceConfig is the Kafka source's connection and fetch settings for
// reading records as a consumer would.
// idHeader names the header of a message's default ID.
func (k *kafkaClient) sourceConfig(idHeader string) kafka.Config {
	return kafka.Config{
		Brokers: k.brokers, TLS: k.tls, SASL: k.sasl, ClientID: "effectively-cli", DialTimeout: 10 * time.Second,
		MaxBytes: 4 << 20, MaxWait: 100 * time.Millisecond, IDHeader: idHeader,
	}
}
