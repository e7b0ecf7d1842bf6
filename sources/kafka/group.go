package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/internal/logx"
	kafkago "github.com/segmentio/kafka-go"
)

// generation is one consumer group generation as this source saw it.
type generation struct {
	id     int32
	lanes  []*lane
	commit chan struct{} // asks for a Kafka offset commit
	// base is the topic metadata the assignment was computed from, when
	// this member computed it (it is the group's leader); nil otherwise.
	base    topicView
	ending  chan struct{} // closed by end
	endOnce sync.Once
}

// end makes the generation end early, so that the member rejoins the group.
func (g *generation) end() { g.endOnce.Do(func() { close(g.ending) }) }

// groupState is what a Source keeps of its consumer group membership,
// guarded by Source.mu.
type groupState struct {
	meta        *metadataReader // set once by start; has its own lock
	generations int             // generations started
	current     *generation     // the generation running, if any
	// leaderView is what this member's balancer assigned from, when it
	// computed the assignment for the generation about to start.
	leaderView topicView
	// missing holds the topics found missing, with when that was last logged.
	missing map[string]time.Time
}

// start joins the consumer group, once.
func (s *Source) start() error {
	s.startOnce.Do(func() {
		c := s.cfg
		s.gs.meta = &metadataReader{s: s} // before the group: its leader's balancer reads metadata
		var err error
		s.group, err = kafkago.NewConsumerGroup(kafkago.ConsumerGroupConfig{
			ID:                c.Group,
			Brokers:           c.Brokers,
			Dialer:            s.dialer,
			Topics:            c.Topics,
			GroupBalancers:    s.groupBalancers(),
			HeartbeatInterval: c.HeartbeatInterval,
			SessionTimeout:    c.SessionTimeout,
			RebalanceTimeout:  c.RebalanceTimeout,
			JoinGroupBackoff:  c.JoinGroupBackoff,
			StartOffset:       c.StartOffset,
			Timeout:           c.DialTimeout,
			Logger:            s.kafkaLogger(slog.LevelDebug),
			ErrorLogger:       s.kafkaLogger(slog.LevelWarn),
		})
		if err != nil {
			s.startErr = fmt.Errorf("kafka: %w", err)
			close(s.runDone)
			return
		}
		s.runCtx, s.cancel = context.WithCancel(context.Background())
		go s.run()
	})
	return s.startErr
}

func (s *Source) run() {
	defer close(s.runDone)
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		s.watchTopics(s.runCtx)
	}()
	defer watch.Wait()
	for {
		gen, err := s.group.Next(s.runCtx)
		if err != nil {
			if s.runCtx.Err() != nil || errors.Is(err, kafkago.ErrGroupClosed) {
				return
			}
			if rebalancing(err) {
				// The group is rebalancing: a normal part of membership,
				// not a failure to report from Fetch. It joins again at once.
				s.log.Info("kafka: consumer group rebalancing", "group", s.cfg.Group, "err", err)
				s.mu.Lock()
				s.gs.leaderView = nil
				s.mu.Unlock()
				continue
			}
			s.log.Warn("kafka: consumer group", "group", s.cfg.Group, "err", err)
			s.setGroupErr(err)
			continue
		}
		s.setGroupErr(nil)
		gen.Start(func(ctx context.Context) { s.runGeneration(ctx, gen) })
	}
}

// rebalancing reports whether err is the coordinator telling a member to
// rejoin because the group is rebalancing (or its membership moved on):
// kafka-go's Next returns these while a rebalance runs, and the member
// rejoins at once.
func rebalancing(err error) bool {
	var ke kafkago.Error
	if !errors.As(err, &ke) {
		return false
	}
	switch ke {
	case kafkago.RebalanceInProgress, kafkago.UnknownMemberId, kafkago.IllegalGeneration, kafkago.MemberIDRequired:
		return true
	}
	return false
}

// setGroupErr records the group's last failure (nil once a generation
// started), for Fetch to report.
func (s *Source) setGroupErr(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.gs.leaderView = nil // computed for a generation that did not start
		err = fmt.Errorf("kafka: consumer group %q: %w", s.cfg.Group, authFailure(err))
		if errors.Is(err, ErrAuthentication) {
			err = consumer.Permanent(err)
		}
	}
	s.sched.SetError(err) // Fetch returns it while no partition is assigned
}

// runGeneration owns the partitions assigned in gen until the generation
// ends (or the topics' metadata changed, see topics.go): it claims them in
// Postgres (those whose row is locked later, see claimPartitions), seeks
// each to its stored offset, pumps records into the lanes, commits settled
// offsets to Kafka, and on the generation's end revokes the lanes.
func (s *Source) runGeneration(ctx context.Context, gen *kafkago.Generation) {
	g := &generation{id: gen.ID, commit: make(chan struct{}, 1), ending: make(chan struct{})}
	s.mu.Lock()
	s.gs.generations++
	s.gs.current = g
	g.base, s.gs.leaderView = s.gs.leaderView, nil
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.gs.current == g {
			s.gs.current = nil
		}
		s.mu.Unlock()
	}()
	var tps []topicPartition
	kafkaStart := make(map[topicPartition]int64)
	for topic, parts := range gen.Assignments {
		for _, p := range parts {
			tp := topicPartition{topic, p.ID}
			tps = append(tps, tp)
			kafkaStart[tp] = p.Offset
		}
	}
	tps = s.routed(gen.ID, tps) // with Routing, only this database's partitions
	sortPartitions(tps)
	s.log.Info("kafka: generation started", "group", s.cfg.Group, "generation", gen.ID,
		"member", gen.MemberID, "partitions", len(tps))

	pumpCtx, stopPumps := context.WithCancel(context.Background())
	var pumps sync.WaitGroup
	// commits is what Kafka holds for the partitions, with the metadata
	// kafka-go's generation does not expose (see origin.go); read before
	// the first claim, when the offsets are kept in Postgres.
	var commits map[topicPartition]kafkaCommit
	// startLanes starts consuming the claimed partitions, each from its
	// offset stored in Postgres (-1: none), else the one in Kafka.
	startLanes := func(claimed []topicPartition, stored map[topicPartition]position) {
		type started struct {
			l     *lane
			start int64
		}
		var lanes []started
		for _, tp := range claimed {
			start, origin := s.startOffset(tp, gen.ID, kafkaStart[tp], stored, commits)
			s.mu.Lock()
			s.forgetCounts(tp, start)
			s.mu.Unlock()
			l := &lane{
				name: laneName(tp.topic, tp.partition), topic: tp.topic, partition: tp.partition, gen: g,
				fetched: -1, delivered: -1, committed: -1, persisted: -1, writing: -1, kafkaCommitted: -1,
				persistedHigh: -1, writingHigh: -1, origin: origin,
			}
			if start >= 0 {
				l.fetched, l.delivered, l.committed = start, start, start
			}
			if pos, ok := stored[tp]; ok && s.store != nil {
				l.persisted, l.persistedHigh = pos.next, pos.high
			}
			if k := kafkaStart[tp]; k >= 0 {
				l.kafkaCommitted = k
			}
			lanes = append(lanes, started{l, start})
		}
		if len(lanes) == 0 {
			return
		}
		names := make([]string, len(lanes))
		for i, st := range lanes {
			names[i] = st.l.name
		}
		s.assigned(ctx, claimed)
		for _, st := range lanes {
			st.l.fetcher = s.newFetcher(topicPartition{st.l.topic, st.l.partition}, st.start)
		}
		s.mu.Lock()
		for _, st := range lanes {
			g.lanes = append(g.lanes, st.l)
			s.lanes = append(s.lanes, st.l)
			s.sched.Open(st.l.name, st.l)
		}
		s.mu.Unlock()
		for _, st := range lanes {
			l := st.l
			pumps.Add(1)
			go func() {
				defer pumps.Done()
				s.pump(pumpCtx, l, l.fetcher)
			}()
		}
		s.log.Info("kafka: partitions claimed", "group", s.cfg.Group, "generation", gen.ID, "lanes", names)
	}
	claimCtx, stopClaims := context.WithCancel(ctx)
	var claims sync.WaitGroup
	claims.Add(1)
	go func() {
		defer claims.Done()
		if s.store != nil && len(tps) > 0 {
			if commits = s.readKafkaCommits(claimCtx, gen.ID, tps); commits == nil {
				return // the generation ended first
			}
		}
		s.claimPartitions(claimCtx, gen.ID, tps, startLanes)
	}()

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-g.ending:
			done = true
		case <-g.commit:
			s.commitKafka(gen, g)
		case <-tick.C:
			s.commitKafka(gen, g)
			s.verifyStored(ctx, g)
		}
	}

	stopClaims()
	claims.Wait() // no lane starts after this
	s.revoke(g)
	s.commitKafka(gen, g)
	stopPumps()
	pumps.Wait()
	for _, l := range g.lanes {
		l.fetcher.close()
	}
	s.log.Info("kafka: generation ended", "group", s.cfg.Group, "generation", gen.ID)
}

// revoke stops handing out g's lanes, lets their in-flight batches finish
// for up to RevokeTimeout (not when the source is closing), then drops them:
// a batch still in flight is refused at BeforeCommit and ignored at Settle.
func (s *Source) revoke(g *generation) {
	s.mu.Lock()
	for _, l := range g.lanes {
		l.state = laneRevoking
		s.sched.Stop(l.name)
	}
	timer := time.NewTimer(s.cfg.RevokeTimeout)
	defer timer.Stop()
	for {
		changed := s.sched.Changed() // a Settle, or Close
		if s.closed || !s.inFlight(g.lanes) {
			break
		}
		s.mu.Unlock()
		timedOut := false
		select {
		case <-changed:
		case <-timer.C:
			timedOut = true
		}
		s.mu.Lock()
		if timedOut {
			break
		}
	}
	abandoned := 0
	for _, l := range g.lanes {
		st := s.sched.Lane(l.name)
		_, retries := s.sched.Remove(l.name)
		s.rememberCounts(l, []*consumer.Batch{st.Committing, st.InFlight}, retries)
		l.state = laneRevoked
		s.dropReleases(l, fmt.Errorf("kafka: partition %s was revoked from generation %d: %w", l.name, l.gen.id, consumer.ErrFenced))
		if st.InFlight != nil {
			abandoned++
		}
		if st.Committing != nil {
			abandoned++
		}
	}
	kept := s.lanes[:0]
	for _, l := range s.lanes {
		if l.gen != g {
			kept = append(kept, l)
		}
	}
	clear(s.lanes[len(kept):])
	s.lanes = kept
	s.mu.Unlock()
	if abandoned > 0 {
		s.log.Warn("kafka: batches abandoned at revoke", "group", s.cfg.Group, "generation", g.id, "batches", abandoned)
	}
	s.revoked(g.lanes)
}

// inFlight reports whether one of lanes has a batch in flight.
func (s *Source) inFlight(lanes []*lane) bool {
	for _, l := range lanes {
		if st := s.sched.Lane(l.name); st.InFlight != nil || st.Committing != nil {
			return true
		}
	}
	return false
}

// commitKafka commits the settled offsets of g's lanes to Kafka, for
// tooling and lag monitoring (and as the position itself with
// KafkaOffsetsOnly). It never commits past what committed in Postgres.
func (s *Source) commitKafka(gen *kafkago.Generation, g *generation) {
	offsets := make(map[string][]kafkago.OffsetCommit)
	s.mu.Lock()
	for _, l := range g.lanes {
		point := l.committed
		var meta string
		if s.store != nil {
			point = min(point, l.persisted) // past records dropped, but not yet stored
			meta = originMetadata(min(l.origin, point))
		}
		if point > l.kafkaCommitted {
			offsets[l.topic] = append(offsets[l.topic], kafkago.OffsetCommit{Partition: l.partition, Offset: point, Metadata: meta})
		}
	}
	s.mu.Unlock()
	if len(offsets) == 0 {
		return
	}
	if err := s.commitOffsets(context.Background(), gen, offsets); err != nil {
		s.kafkaCommits.Failed(s.log, logx.KafkaCommitFailed("kafka", s.store == nil), err, "group", s.cfg.Group, "generation", g.id)
		return
	}
	s.kafkaCommits.Succeeded()
	s.mu.Lock()
	for _, l := range g.lanes {
		for _, c := range offsets[l.topic] {
			if c.Partition == l.partition && c.Offset > l.kafkaCommitted {
				l.kafkaCommitted = c.Offset
			}
		}
	}
	s.mu.Unlock()
}

// kafkaLogger adapts kafka-go's printf logging to the configured logger.
func (s *Source) kafkaLogger(level slog.Level) kafkago.Logger {
	if !s.log.Enabled(context.Background(), level) {
		return nil
	}
	return kafkago.LoggerFunc(func(format string, args ...any) {
		s.log.Log(context.Background(), level, "kafka-go: "+fmt.Sprintf(format, args...), "group", s.cfg.Group)
	})
}

// verifyStored ends g when the offsets table holds less for one of its
// lanes than the lane knows it stored: the database lost commits (an
// asynchronous failover) or a replay moved the offsets back. A lane's next
// offset write finds that out too, but a lane with nothing more to consume
// writes nothing, and its lost commits would wait for its next record;
// this check, once a second, finds them within a second. The member
// rejoins and consumes the lanes again from the offsets stored. What the
// lanes know is read before the table, so a batch committing meanwhile
// can only make the table hold more.
func (s *Source) verifyStored(ctx context.Context, g *generation) {
	if s.store == nil {
		return
	}
	type check struct {
		l     *lane
		known position
	}
	var checks []check
	var tps []topicPartition
	s.mu.Lock()
	for _, l := range g.lanes {
		if k := l.known(); l.state == laneActive && !l.fenced && (k.next >= 0 || k.high >= 0) {
			checks = append(checks, check{l, k})
			tps = append(tps, topicPartition{l.topic, l.partition})
		}
	}
	s.mu.Unlock()
	if len(checks) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stored, err := s.store.positions(rctx, tps)
	if err != nil {
		s.log.Debug("kafka: reading the stored offsets to compare them with the lanes'", "group", s.cfg.Group, "generation", g.id, "err", err)
		return
	}
	for _, c := range checks {
		found, ok := stored[topicPartition{c.l.topic, c.l.partition}]
		if !ok {
			found = noPosition
		}
		if !behind(found, c.known) {
			continue
		}
		s.log.Error("kafka: the offsets table went back; rejoining the group to consume again from the stored offset",
			"group", s.cfg.Group, "lane", c.l.name, "generation", g.id, "stored", found.next, "known", c.known.next,
			"stored_high", found.high, "known_high", c.known.high)
		g.end()
		return
	}
}
