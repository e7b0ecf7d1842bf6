package franz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/consumer/lanes"
	"github.com/effectively-once/effectively/dedupe"
	"github.com/effectively-once/effectively/internal/logx"
	"github.com/effectively-once/effectively/pg"
	"github.com/effectively-once/effectively/sources/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrClosed is returned by Fetch after Close.
var ErrClosed = errors.New("franz: source closed")

// Source delivers the records of a Kafka consumer group, read with
// franz-go, to a consumer.Consumer. It implements consumer.Source,
// consumer.TxSource and consumer.HorizonSource. Make one with New, hand it
// to consumer.New (whose Migrate creates the offsets table too), and Close
// it after the consumer's Run returned.
type Source struct {
	cfg   Config
	opts  []kgo.Opt // the client's, built by New
	store *kafka.OffsetStore
	log   *slog.Logger
	// rebalanceTimeout is the group's, as kgo resolved it from Opts.
	rebalanceTimeout time.Duration
	// instanceID is the member's static instance ID, "" for a dynamic
	// member (Config.InstanceID or kgo.InstanceID in Opts).
	instanceID string
	// fencedInstance holds the permanent error Fetch returns once the
	// coordinator fenced this static member (see static.go).
	fencedInstance atomic.Pointer[error]

	startOnce sync.Once
	closeOnce sync.Once
	cl        *kgo.Client
	gcl       *kgo.Client // the client as the group's callbacks got it
	startErr  error
	// pauseMu orders the pauses and resumes of full partitions, so that
	// the client ends in the state the lane asked for last (syncPause).
	pauseMu sync.Mutex
	runCtx  context.Context
	cancel  context.CancelFunc
	done    sync.WaitGroup // the poll and commit loops

	// sched hands out the lanes' records: one lane per claimed partition,
	// named like the lane, whose SourceData is the *lane.
	sched *lanes.Lanes

	// kafkaCommits escalates offset commits to Kafka that keep failing.
	kafkaCommits logx.Persisting

	mu     sync.Mutex
	lanes  map[TopicPartition]*lane // active and revoking lanes, each open in sched
	closed bool
	// counts carries Message.Attempt across ownerships of a partition.
	counts map[TopicPartition]*deliveryCounts
	// commits is what Kafka held for the partitions of the assignment
	// being set up (read by OnOffsetsFetched, for AdjustFetchOffsetsFn).
	commits map[TopicPartition]kafkaCommit
	// session is canceled when the group session that claimed the lanes
	// begins revoking: it bounds the claims still to be retried.
	session context.Context
	commit  chan struct{} // asks for a Kafka offset commit

	horizon horizonCache
}

var (
	_ consumer.TxSource      = (*Source)(nil)
	_ consumer.HorizonSource = (*Source)(nil)
	_ dedupe.Migrator        = (*Source)(nil)
)

// New validates cfg and returns a Source. db holds the offsets table; it
// may be nil only with cfg.KafkaOffsetsOnly. The source joins the group on
// the first Fetch.
func New(db pg.DB, cfg Config) (*Source, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Source{
		cfg:    cfg,
		log:    cfg.Logger,
		lanes:  map[TopicPartition]*lane{},
		counts: map[TopicPartition]*deliveryCounts{},
		commit: make(chan struct{}, 1),
		sched:  lanes.New(lanes.Config{}),
	}
	// The user's options, resolved alone, to read what the source
	// depends on and refuse what contradicts it.
	user := append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}, cfg.Opts...)
	probe, err := kgo.NewClient(user...)
	if err != nil {
		return nil, bad("Opts", "%v", err)
	}
	s.rebalanceTimeout, _ = probe.OptValue(kgo.RebalanceTimeout).(time.Duration)
	optInstance, _ := probe.OptValue(kgo.InstanceID).(string)
	probe.Close()
	switch {
	case cfg.InstanceID != "" && optInstance != "" && optInstance != cfg.InstanceID:
		return nil, bad("InstanceID", "%q contradicts kgo.InstanceID(%q) in Opts", cfg.InstanceID, optInstance)
	case cfg.InstanceID != "":
		s.instanceID = cfg.InstanceID
		user = append(user, kgo.InstanceID(cfg.InstanceID))
	default:
		s.instanceID = optInstance
	}
	if s.rebalanceTimeout <= 0 {
		s.rebalanceTimeout = 60 * time.Second
	}
	if s.cfg.RevokeTimeout == 0 {
		s.cfg.RevokeTimeout = min(10*time.Second, s.rebalanceTimeout/2)
	}
	if s.cfg.RevokeTimeout >= s.rebalanceTimeout {
		return nil, bad("RevokeTimeout", "%s must be shorter than the group's rebalance timeout %s, or the coordinator drops the member before its batches finish",
			s.cfg.RevokeTimeout, s.rebalanceTimeout)
	}
	isolation := kgo.ReadCommitted()
	if cfg.ReadUncommitted {
		isolation = kgo.ReadUncommitted()
	}
	s.opts = append([]kgo.Opt{kgo.ClientID(DefaultClientID), kgo.FetchIsolationLevel(isolation)}, user...)
	s.opts = append(s.opts,
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.OnOffsetsFetched(s.onOffsetsFetched),
		kgo.AdjustFetchOffsetsFn(s.adjustOffsets),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onLost),
		kgo.WithHooks(connectHook{s}),
	)
	if !cfg.KafkaOffsetsOnly {
		if db == nil {
			return nil, bad("db", "a database is required unless KafkaOffsetsOnly is set")
		}
		s.store = kafka.NewOffsetStore(db, cfg.Group, cfg.Schema, cfg.OffsetsTable)
	}
	return s, nil
}

// Migrations returns the migration line of the offsets table (none with
// KafkaOffsetsOnly): sources/kafka's, so a consumer's Migrate creates the
// table both sources share.
func (s *Source) Migrations() []pg.Line {
	if s.store == nil {
		return nil
	}
	return []pg.Line{s.store.Line()}
}

// Client returns the franz-go client the source consumes with, nil before
// the first Fetch. It is for what franz-go offers beyond the source
// (its metrics through kgo hooks are better set with Config.Opts); do not
// poll, commit, seek or pause with it: the source owns the positions.
func (s *Source) Client() *kgo.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cl
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
// how many records lie between its commit point and the end of the
// partition's log, as of the partition's last fetch. Partitions whose
// position is not yet known are left out. Feed it to a metrics gauge (see
// metrics/effprom's ReportLag).
func (s *Source) Lag() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int64{}
	for _, l := range s.lanes {
		if l.state == laneActive && !l.fenced && l.committed >= 0 && l.highWatermark >= 0 {
			out[l.name] = max(l.highWatermark-l.committed, 0)
		}
	}
	return out
}

// Fetch blocks until one claimed partition that has no batch in flight has
// messages (fresh ones, or handed-back ones whose delay is over), and
// returns up to max of them in offset order. While no partition is
// assigned and the client keeps failing (wrong brokers, say), it returns
// the client's error, so that the consumer reports it and can give up
// after consumer.Config.SourceFailureTimeout; when the brokers refused the
// credentials or certificates, the error matches ErrAuthentication and is
// permanent. After Close it returns ErrClosed, which is permanent.
func (s *Source) Fetch(ctx context.Context, max int) (*consumer.Batch, error) {
	if err := s.start(); err != nil {
		return nil, err
	}
	b, err := s.sched.Next(ctx, max)
	if errors.Is(err, lanes.ErrClosed) {
		return nil, consumer.Permanent(ErrClosed)
	}
	if err != nil {
		return nil, err
	}
	l := b.SourceData.(*lane)
	s.mu.Lock()
	l.handedOut(b)
	resume := l.paused && s.sched.Lane(l.name).Buffered <= s.cfg.PartitionBuffer/2
	if resume {
		l.paused = false
	}
	s.mu.Unlock()
	if resume {
		s.syncPause(s.cl, l)
	}
	return b, nil
}

// BeforeCommit stores the partition's next offset in tx, provided this
// source's generation still owns the partition; otherwise it returns an
// error wrapping consumer.ErrFenced and the batch is dropped.
func (s *Source) BeforeCommit(ctx context.Context, tx pgx.Tx, b *consumer.Batch, ack []*consumer.Message) error {
	l, ok := b.SourceData.(*lane)
	if !ok {
		return fmt.Errorf("franz: BeforeCommit with a batch of another source")
	}
	acked := make(map[*consumer.Message]struct{}, len(ack))
	for _, a := range ack {
		acked[a] = struct{}{}
	}
	s.mu.Lock()
	st := s.sched.Lane(l.name)
	if st.InFlight != b || l.state == laneRevoked || l.fenced {
		s.mu.Unlock()
		return fmt.Errorf("franz: partition %s was revoked from generation %d: %w", l.name, l.gen, consumer.ErrFenced)
	}
	next := l.nextOffset(st.Retries, b.Messages, acked)
	to := kafka.StoredPosition{Next: next, High: highOffset(next, ack)}
	if s.store != nil && len(ack) > 0 {
		l.writing, l.writingHigh = to.Next, to.High
	}
	known := l.known()
	s.mu.Unlock()
	if s.store == nil || len(ack) == 0 {
		return nil
	}
	err := s.store.Write(ctx, tx, l.tp, l.gen, to, known)
	if errors.Is(err, consumer.ErrFenced) {
		s.mu.Lock()
		l.fenced = true
		s.sched.Stop(l.name)
		s.sched.Finish(b, false) // nothing of it is acknowledged or retried
		s.mu.Unlock()
		s.fenced(l, err)
	}
	return err
}

// Settle records a batch's outcome: acked messages move the partition's
// commit point (committed to Kafka shortly after), retried ones are
// delivered again after their delay, and the rest are delivered again at
// once. Nothing is recorded for a partition this source no longer owns.
func (s *Source) Settle(ctx context.Context, b *consumer.Batch, ack []*consumer.Message, retry []consumer.Retry) error {
	l, ok := b.SourceData.(*lane)
	if !ok {
		return fmt.Errorf("franz: Settle with a batch of another source")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.state == laneRevoked || l.fenced {
		s.sched.Finish(b, false) // dropped: the lane's next owner delivers it again
		return nil
	}
	if !s.sched.Settle(b, ack, retry) {
		return nil
	}
	before := l.committed
	l.settled(s.sched.Lane(l.name).Retries, len(ack) > 0, s.store != nil)
	if l.committed > before {
		s.askCommit()
	}
	return nil
}

// askCommit asks the commit loop for a Kafka offset commit.
func (s *Source) askCommit() {
	select {
	case s.commit <- struct{}{}:
	default:
	}
}

// Close leaves the group and stops fetching. Batches still in flight are
// abandoned: their commit is refused, and the partition's next owner
// delivers them again. A static member (Config.InstanceID) leaves too,
// unless the coordinator fenced it: the others take its partitions over
// at once rather than after the session timeout.
func (s *Source) Close() error {
	s.closeOnce.Do(func() {
		s.startOnce.Do(func() {}) // no start after Close
		s.mu.Lock()
		s.closed = true
		s.sched.Close()
		cl := s.cl
		s.mu.Unlock()
		if cl == nil {
			return
		}
		s.cancel()
		s.done.Wait()
		if s.instanceID != "" {
			s.leaveStatic(cl)
		}
		cl.Close() // leaves the group (a dynamic member): onRevoked drops the lanes at once
	})
	return nil
}
