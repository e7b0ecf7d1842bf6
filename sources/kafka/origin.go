package kafka

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// Offsets committed to Kafka carry metadata when the offsets live in
// Postgres: a marker that the commit followed a Postgres transaction that
// stored them, and the partition's origin, the offset from which this
// group first consumed the partition with its offsets in Postgres. A
// partition whose offsets row is missing in Postgres while Kafka holds such
// a commit lost its row with the database's last commits (an asynchronous
// failover to a standby that lacked them, or a restore): its effects and
// markers went with it, so the source consumes it again from its origin,
// not from the offset in Kafka, which is past the lost range. A commit
// without the marker (another client, an earlier version, KafkaOffsetsOnly)
// is an existing group starting to keep its offsets in Postgres, and the
// source starts from it.
const originPrefix = "effectively/1 pg origin="

// kafkaOpTimeout bounds one offset request to the group coordinator.
const kafkaOpTimeout = 10 * time.Second

// kafkaCommit is what Kafka holds for one partition of the group.
type kafkaCommit struct {
	offset int64 // -1 for none
	origin int64 // -1 unless the commit carries the marker
}

func originMetadata(origin int64) string {
	if origin < 0 {
		return ""
	}
	return originPrefix + strconv.FormatInt(origin, 10)
}

// parseOrigin returns the origin a commit's metadata carries, or -1.
func parseOrigin(meta string) int64 {
	rest, ok := strings.CutPrefix(meta, originPrefix)
	if !ok {
		return -1
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// client returns a client of the cluster for offset requests; requests to
// the group are routed to its coordinator.
func (s *Source) client() *kafkago.Client {
	return &kafkago.Client{Addr: kafkago.TCP(s.cfg.Brokers...), Timeout: kafkaOpTimeout, Transport: s.transport}
}

// readKafkaCommits reads the offsets and metadata the group committed to
// Kafka for tps, trying again with backoff until it succeeds or ctx is
// done (nil then).
func (s *Source) readKafkaCommits(ctx context.Context, gen int32, tps []topicPartition) map[topicPartition]kafkaCommit {
	req := &kafkago.OffsetFetchRequest{GroupID: s.cfg.Group, Topics: map[string][]int{}}
	for _, tp := range tps {
		req.Topics[tp.topic] = append(req.Topics[tp.topic], tp.partition)
	}
	for failures := 0; ; failures++ {
		got, err := s.fetchKafkaCommits(ctx, req)
		if err == nil {
			return got
		}
		if ctx.Err() != nil {
			return nil
		}
		s.log.Warn("kafka: reading the offsets committed to Kafka; trying again (partitions whose offsets row is missing in Postgres cannot start before)",
			"group", s.cfg.Group, "generation", gen, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(min(100*time.Millisecond<<min(failures, 8), 10*time.Second)):
		}
	}
}

func (s *Source) fetchKafkaCommits(ctx context.Context, req *kafkago.OffsetFetchRequest) (map[topicPartition]kafkaCommit, error) {
	res, err := s.client().OffsetFetch(ctx, req)
	if err != nil {
		return nil, err
	}
	if res.Error != nil {
		return nil, res.Error
	}
	out := make(map[topicPartition]kafkaCommit)
	for topic, parts := range res.Topics {
		for _, p := range parts {
			if p.Error != nil {
				return nil, fmt.Errorf("%s: %w", laneName(topic, p.Partition), p.Error)
			}
			c := kafkaCommit{offset: p.CommittedOffset, origin: -1}
			if c.offset >= 0 {
				c.origin = parseOrigin(p.Metadata)
			} else {
				c.offset = -1
			}
			out[topicPartition{topic, p.Partition}] = c
		}
	}
	return out, nil
}

// commitOffsets commits offsets (with each partition's origin as metadata,
// see originPrefix) for generation gen.
func (s *Source) commitOffsets(ctx context.Context, gen *kafkago.Generation, offsets map[string][]kafkago.OffsetCommit) error {
	ctx, cancel := context.WithTimeout(ctx, kafkaOpTimeout)
	defer cancel()
	res, err := s.client().OffsetCommit(ctx, &kafkago.OffsetCommitRequest{
		GroupID: s.cfg.Group, GenerationID: int(gen.ID), MemberID: gen.MemberID, Topics: offsets,
	})
	if err != nil {
		return err
	}
	for topic, parts := range res.Topics {
		for _, p := range parts {
			if p.Error != nil {
				return fmt.Errorf("%s: %w", laneName(topic, p.Partition), p.Error)
			}
		}
	}
	return nil
}

// startOffset returns the offset to consume tp from, and its origin (-1
// while unknown: the fetcher resolves a start such as kafkago.FirstOffset):
// the next offset stored in Postgres; else, when Kafka holds an offset the
// source committed after storing it in Postgres, which the database no
// longer has, the partition's origin; else kafkaStart, the offset in Kafka
// (or Config.StartOffset when there is none).
func (s *Source) startOffset(tp topicPartition, gen int32, kafkaStart int64, stored map[topicPartition]position, commits map[topicPartition]kafkaCommit) (start, origin int64) {
	c, ok := commits[tp]
	if !ok {
		c = kafkaCommit{offset: -1, origin: -1}
	}
	if pos, ok := stored[tp]; ok && pos.next >= 0 {
		if c.origin >= 0 {
			return pos.next, min(c.origin, pos.next)
		}
		return pos.next, pos.next
	}
	if s.store != nil && c.origin >= 0 {
		s.log.Warn("kafka: the offsets table holds no offset for a partition although this source stored one there before committing "+
			"offset kafka_offset to Kafka: the database lost its last commits (an asynchronous failover, a restore from backup), and the "+
			"partition's effects and markers with them; consuming it again from origin, where the group first consumed it "+
			"(if the consumer was pointed at another database on purpose, see docs/failover.md)",
			"group", s.cfg.Group, "lane", laneName(tp.topic, tp.partition), "generation", gen, "kafka_offset", c.offset, "origin", c.origin)
		return c.origin, c.origin
	}
	if kafkaStart >= 0 {
		return kafkaStart, kafkaStart
	}
	return kafkaStart, -1
}
