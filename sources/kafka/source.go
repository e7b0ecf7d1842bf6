package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/lanes"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/internal/logx"
	"github.com/effectively-once/effectively/pg"
	"github.com/jackc/pgx/v5"
	kafkago "github.com/segmentio/kafka-go"
)

// ErrClosed is returned by Fetch after Close.
var ErrClosed = errors.New("kafka: source closed")

// Source delivers the records of a Kafka consumer group to a
// consumer.Consumer. It implements consumer.Source, consumer.TxSource and
// consumer.HorizonSource. Make one with New, hand it to consumer.New
// (whose Migrate creates the offsets table too), and Close it after the
// consumer's Run returned.
type Source struct {
	cfg    Config
	store  *offsetStore // nil with KafkaOffsetsOnly
	dialer *kafkago.Dialer
	// transport carries the source's own requests to the group
	// coordinator (offsets with their metadata, see origin.go).
	transport *kafkago.Transport
	log       *slog.Logger

	// kafkaCommits escalates offset commits to Kafka that keep failing.
	kafkaCommits logx.Persisting

	startOnce sync.Once
	closeOnce sync.Once
	group     *kafkago.ConsumerGroup
	startErr  error
	runCtx    context.Context
	cancel    context.CancelFunc
	runDone   chan struct{}

	// sched hands out the lanes' records: one lane per assigned partition,
	// named like the lane, whose SourceData is the *lane.
	sched *lanes.Lanes
	// pipelined: a partition's next batch is handed out while its last one
	// commits (Pipeline, pipeline.go).
	pipelined atomic.Bool
	releases  atomic.Int64 // batches released while they commit

	mu     sync.Mutex
	lanes  []*lane // active and revoking lanes, each open in sched
	closed bool
	// counts carries Message.Attempt across generations: what this source
	// delivered of each partition and has not seen committed.
	counts map[topicPartition]*deliveryCounts
	// gs is the consumer group membership's state (group.go, topics.go).
	gs groupState

	horizon horizonCache
}

var (
	_ consumer.TxSource      = (*Source)(nil)
	_ consumer.HorizonSource = (*Source)(nil)
	_ dedupe.Migrator        = (*Source)(nil)
)

// New validates cfg and returns a Source. db holds the offsets table; it may
// be nil only with cfg.KafkaOffsetsOnly. The source joins the group on the
// first Fetch.
func New(db pg.DB, cfg Config) (*Source, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Source{
		cfg: cfg,
		log: cfg.Logger,
		dialer: &kafkago.Dialer{
			ClientID:      cfg.ClientID,
			Timeout:       cfg.DialTimeout,
			DualStack:     true,
			TLS:           cfg.TLS,
			SASLMechanism: cfg.SASL,
		},
		transport: &kafkago.Transport{TLS: cfg.TLS, SASL: cfg.SASL, ClientID: cfg.ClientID, DialTimeout: cfg.DialTimeout},
		runDone:   make(chan struct{}),
		counts:    map[topicPartition]*deliveryCounts{},
		sched:     lanes.New(lanes.Config{LaneBuffer: cfg.PartitionBuffer}),
	}
	if !cfg.KafkaOffsetsOnly {
		if db == nil {
			return nil, &ConfigError{Package: "kafka", Field: "db", Reason: "a database is required unless KafkaOffsetsOnly is set"}
		}
		s.store = newOffsetStore(db, cfg.Group, cfg.Schema, cfg.OffsetsTable)
	}
	return s, nil
}

// Migrations returns the migration line of the offsets table (none with
// KafkaOffsetsOnly), for pg.Migrate or pg.MigrationSQL; a
// consumer's Migrate applies it with the consumer's other tables.
func (s *Source) Migrations() []pg.Line {
	if s.store == nil {
		return nil
	}
	return []pg.Line{s.store.line()}
}

// Assignment returns the lanes ("topic/partition") this source currently
// owns and hands out, sorted.
func (s *Source) Assignment() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range s.lanes {
		if l.state == laneActive && !l.fenced {
			out = append(out, l.name)
		}
	}
	sort.Strings(out)
	return out
}

// Lag returns, for each partition this source reads ("topic/partition"),
// how many records lie between its commit point (the next offset whose
// outcome is not yet committed) and the end of the partition's log, as of
// the partition's last fetch. Partitions whose position is not yet known
// are left out. Feed it to a metrics gauge (see
// metrics/effprom's ReportLag).
func (s *Source) Lag() map[string]int64 {
	s.mu.Lock()
	out := map[string]int64{}
	for _, l := range s.lanes {
		if l.state == laneActive && !l.fenced && l.fetcher != nil && l.committed >= 0 {
			if end := l.fetcher.highWatermark.Load(); end >= 0 {
				out[l.name] = max(end-l.committed, 0)
			}
		}
	}
	s.mu.Unlock()
	return out
}

// Fetch blocks until one assigned partition that has no batch in flight has
// messages (fresh ones, or handed-back ones whose delay is over), and
// returns up to max of them in offset order. While no partition is assigned
// and the consumer group keeps failing (wrong brokers, say), it returns the
// group's error, so that the consumer reports it and can give up after
// consumer.Config.SourceFailureTimeout; when the brokers refused the
// credentials or certificates, the error matches ErrAuthentication and is
// permanent, so the consumer stops at once. After Close it returns
// ErrClosed, which is permanent.
func (s *Source) Fetch(ctx context.Context, max int) (*consumer.Batch, error) {
	if err := s.start(); err != nil {
		return nil, err
	}
	b, err := s.sched.Next(ctx, max)
	if errors.Is(err, lanes.ErrClosed) {
		return nil, consumer.Permanent(ErrClosed)
	}
	if err != nil {
		return nil, err // ctx's, or the group's failure (setGroupErr)
	}
	l := b.SourceData.(*lane)
	s.mu.Lock()
	st := s.sched.Lane(l.name)
	l.handedOut(b, st)
	if st.InFlight == b {
		s.bindWaiter(l, b, st.After)
	}
	s.mu.Unlock()
	return b, nil
}

// BeforeCommit stores the partition's next offset in tx, provided this
// consumer's generation still owns the partition; otherwise it returns an
// error wrapping consumer.ErrFenced and the batch is dropped.
func (s *Source) BeforeCommit(ctx context.Context, tx pgx.Tx, b *consumer.Batch, ack []*consumer.Message) error {
	l, ok := b.SourceData.(*lane)
	if !ok {
		return fmt.Errorf("kafka: BeforeCommit with a batch of another source")
	}
	acked := ackSet(ack)
	s.mu.Lock()
	st := s.sched.Lane(l.name)
	if (st.InFlight != b && st.Committing != b) || l.state == laneRevoked || l.fenced {
		s.mu.Unlock()
		return fmt.Errorf("kafka: partition %s was revoked from generation %d: %w", l.name, l.gen.id, consumer.ErrFenced)
	}
	if st.Committing != nil && st.Committing != b {
		// The batch before b has not been settled: b's offset would
		// acknowledge what may not commit. AwaitPrevious keeps this from
		// happening.
		s.mu.Unlock()
		return fmt.Errorf("kafka: partition %s: the batch before this one has not been settled", l.name)
	}
	next := l.nextOffset(outstanding(st, b), b.Messages, acked)
	to := position{next: next, high: highOffset(next, ack)}
	if s.store != nil && len(ack) > 0 {
		l.writing, l.writingHigh = to.next, to.high
	}
	known := l.known()
	if s.store == nil || len(ack) == 0 {
		s.released(l, b)
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	err := s.store.write(ctx, tx, topicPartition{l.topic, l.partition}, l.gen.id, to, known)
	s.mu.Lock()
	switch {
	case errors.Is(err, consumer.ErrFenced):
		l.fenced = true
		s.sched.Stop(l.name)
		s.sched.Finish(b, false) // nothing of it is acknowledged or retried
		s.dropReleases(l, err)
	case err == nil && l.state != laneRevoked && !l.fenced:
		s.released(l, b)
	}
	s.mu.Unlock()
	if errors.Is(err, consumer.ErrFenced) {
		s.fenced(l, err)
	}
	return err
}

// fenced reports a lane whose offsets write was refused. When the table
// went back, the generation ends, so that the member rejoins and consumes
// again from the offset stored.
func (s *Source) fenced(l *lane, err error) {
	var back *wentBackError
	if errors.As(err, &back) {
		s.log.Error("kafka: the offsets table went back; rejoining the group to consume again from the stored offset",
			"group", s.cfg.Group, "lane", l.name, "generation", l.gen.id, "stored", back.found.next, "known", back.known.next,
			"stored_high", back.found.high, "known_high", back.known.high)
		l.gen.end()
		return
	}
	s.log.Warn("kafka: partition fenced by a newer generation", "group", s.cfg.Group, "lane", l.name, "generation", l.gen.id)
}

// Settle records a batch's outcome: acked messages move the partition's
// commit point (committed to Kafka shortly after), retried ones are
// delivered again after their delay, and the rest are delivered again at
// once. Nothing is recorded for a partition this consumer no longer owns.
func (s *Source) Settle(ctx context.Context, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	l, ok := b.SourceData.(*lane)
	if !ok {
		return fmt.Errorf("kafka: Settle with a batch of another source")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.state == laneRevoked || l.fenced {
		s.sched.Finish(b, false) // dropped: the lane's next owner delivers it again
		s.settledRelease(l, b, nil, nil, fmt.Errorf("kafka: partition %s was revoked from generation %d: %w", l.name, l.gen.id, consumer.ErrFenced))
		return nil
	}
	if !s.sched.Settle(b, ack, retry) {
		s.settledRelease(l, b, nil, nil, fmt.Errorf("kafka: partition %s was revoked from generation %d: %w", l.name, l.gen.id, consumer.ErrFenced))
		return nil // fenced or revoked meanwhile: dropped
	}
	s.settledRelease(l, b, ack, retry, nil)
	before := l.committed
	l.settled(outstanding(s.sched.Lane(l.name), nil), len(ack) > 0, s.store != nil)
	if l.committed > before {
		l.notifyCommit()
	}
	return nil
}

func ackSet(ack []*consumer.Message) map[*consumer.Message]struct{} {
	m := make(map[*consumer.Message]struct{}, len(ack))
	for _, a := range ack {
		m[a] = struct{}{}
	}
	return m
}

// Close leaves the group and stops fetching. Batches still in flight are
// abandoned: their commit is refused, and the partition's next owner
// delivers them again.
func (s *Source) Close() error {
	s.closeOnce.Do(func() {
		s.startOnce.Do(func() { close(s.runDone) }) // no start after Close
		s.mu.Lock()
		s.closed = true
		s.sched.Close()
		s.mu.Unlock()
		if s.group != nil {
			s.cancel()
			_ = s.group.Close()
			<-s.runDone
		}
		s.transport.CloseIdleConnections()
	})
	return nil
}
