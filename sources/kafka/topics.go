package kafka

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// The consumer group's assignment only covers the partitions its leader
// saw when it computed the assignment, and kafka-go's leader drops every
// topic's partitions when one subscribed topic does not exist. So the
// source reads the topics' metadata itself: the balancers below give the
// leader's balancer the partitions of the topics that exist, and every
// MetadataInterval the source reads the metadata again; when the member
// that computed the current assignment sees it changed (a topic created or
// deleted, partitions added), it ends its generation and rejoins, which
// makes the coordinator rebalance the group. Only the leader's rejoin makes
// the coordinator rebalance (another member rejoining with the same
// subscription gets its assignment back unchanged), so only it acts.

// missingTopicReminder is how often a topic that still does not exist is
// logged again.
const missingTopicReminder = 5 * time.Minute

// topicView is the partition count of each topic that exists, by name.
type topicView map[string]int

func viewOf(parts []kafkago.Partition) topicView {
	v := topicView{}
	for _, p := range parts {
		if n := p.ID + 1; n > v[p.Topic] {
			v[p.Topic] = n
		}
	}
	return v
}

// changes describes how v differs from old on topics, or returns "" when
// it does not.
func (v topicView) changes(old topicView, topics []string) string {
	var out []string
	for _, t := range topics {
		n, ok := v[t]
		o, had := old[t]
		switch {
		case ok && !had:
			out = append(out, fmt.Sprintf("%s created (%d partitions)", t, n))
		case !ok && had:
			out = append(out, t+" gone")
		case n != o:
			out = append(out, fmt.Sprintf("%s has %d partitions, was %d", t, n, o))
		}
	}
	return strings.Join(out, "; ")
}

// metadataReader reads topic metadata over a connection it keeps open
// between reads. Its methods may be called from several goroutines.
type metadataReader struct {
	s      *Source
	mu     sync.Mutex
	conn   *kafkago.Conn
	closed bool
}

// read returns the partitions of those topics that exist, and for each of
// the others why not (kafka-go's UnknownTopicOrPartition for a topic that
// does not exist, or another error of the topic such as an authorization
// failure). err is set when the brokers could not be asked.
func (m *metadataReader) read(ctx context.Context, topics []string) (parts []kafkago.Partition, missing map[string]error, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, nil, errors.New("kafka: source closed")
	}
	if m.conn == nil {
		for _, b := range m.s.cfg.Brokers {
			if m.conn, err = m.s.dialer.DialContext(ctx, "tcp", b); err == nil {
				break
			}
		}
		if m.conn == nil {
			return nil, nil, err
		}
	}
	deadline := time.Now().Add(m.s.cfg.DialTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := m.conn.SetDeadline(deadline); err != nil {
		m.dropLocked()
		return nil, nil, err
	}
	missing = map[string]error{}
	for _, t := range topics {
		ps, err := m.conn.ReadPartitions(t)
		var kerr kafkago.Error
		switch {
		case errors.As(err, &kerr):
			missing[t] = err
		case err != nil:
			m.dropLocked()
			return nil, nil, err
		case len(ps) == 0:
			missing[t] = kafkago.UnknownTopicOrPartition
		default:
			parts = append(parts, ps...)
		}
	}
	return parts, missing, nil
}

func (m *metadataReader) dropLocked() {
	if m.conn != nil {
		_ = m.conn.Close()
		m.conn = nil
	}
}

func (m *metadataReader) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	m.dropLocked()
}

// watchTopics reads the metadata of the configured topics every
// MetadataInterval until ctx is done.
func (s *Source) watchTopics(ctx context.Context) {
	defer s.gs.meta.close()
	tick := time.NewTicker(s.cfg.MetadataInterval)
	defer tick.Stop()
	for {
		s.pollTopics(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// pollTopics reads the topics' metadata once, logs the topics that are
// missing, and makes the current generation end when this member computed
// its assignment from metadata that changed since.
func (s *Source) pollTopics(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	parts, missing, err := s.gs.meta.read(rctx, s.cfg.Topics)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			// An unreachable cluster is reported by the consumer group too.
			s.log.Debug("kafka: reading topic metadata", "group", s.cfg.Group, "err", err)
		}
		return
	}
	s.noteMissing(s.cfg.Topics, missing)
	view := viewOf(parts)
	s.mu.Lock()
	g := s.gs.current
	var changed string
	if g != nil && g.base != nil {
		changed = view.changes(g.base, s.cfg.Topics)
	}
	s.mu.Unlock()
	if changed != "" {
		s.log.Info("kafka: topics changed; rejoining the group to rebalance", "group", s.cfg.Group,
			"generation", g.id, "changes", changed)
		g.end()
	}
}

// noteMissing logs the topics that do not exist (or cannot be read), when
// first seen so and then every missingTopicReminder, and the ones that
// came back.
func (s *Source) noteMissing(topics []string, missing map[string]error) {
	now := time.Now()
	var warn, back []string
	s.mu.Lock()
	if s.gs.missing == nil {
		s.gs.missing = map[string]time.Time{}
	}
	for _, t := range slices.Sorted(maps.Keys(missing)) {
		if last, ok := s.gs.missing[t]; !ok || now.Sub(last) >= missingTopicReminder {
			s.gs.missing[t] = now
			warn = append(warn, t)
		}
	}
	for _, t := range topics {
		if _, was := s.gs.missing[t]; !was {
			continue
		}
		if _, ok := missing[t]; !ok {
			delete(s.gs.missing, t)
			back = append(back, t)
		}
	}
	s.mu.Unlock()
	for _, t := range warn {
		s.log.Warn("kafka: topic does not exist or cannot be read; consuming the group's other topics meanwhile and checking again every MetadataInterval",
			"group", s.cfg.Group, "topic", t, "every", s.cfg.MetadataInterval, "err", missing[t])
	}
	for _, t := range back {
		s.log.Info("kafka: topic exists now", "group", s.cfg.Group, "topic", t)
	}
}

// leaderBalancer is a kafka-go GroupBalancer, under the same protocol name
// as the one it wraps (so members of other versions still agree on it),
// that assigns the partitions of the subscribed topics that exist, even
// when some do not, and records what it assigned from.
type leaderBalancer struct {
	kafkago.GroupBalancer
	s *Source
}

func (b leaderBalancer) AssignGroups(members []kafkago.GroupMember, partitions []kafkago.Partition) kafkago.GroupMemberAssignments {
	s := b.s
	var topics []string
	for _, m := range members {
		topics = append(topics, m.Topics...)
	}
	slices.Sort(topics)
	topics = slices.Compact(topics)
	seen := viewOf(partitions)
	complete := true
	for _, t := range topics {
		if _, ok := seen[t]; !ok {
			complete = false
		}
	}
	if !complete {
		// kafka-go read no partition at all when one topic was missing.
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DialTimeout)
		parts, missing, err := s.gs.meta.read(ctx, topics)
		cancel()
		if err != nil {
			s.log.Warn("kafka: reading topic metadata for the group's assignment", "group", s.cfg.Group, "err", err)
		} else {
			partitions = parts
			s.noteMissing(topics, missing)
		}
	}
	s.mu.Lock()
	s.gs.leaderView = viewOf(partitions)
	s.mu.Unlock()
	return b.GroupBalancer.AssignGroups(members, partitions)
}

func (s *Source) balancers() []kafkago.GroupBalancer {
	return []kafkago.GroupBalancer{
		leaderBalancer{kafkago.RangeGroupBalancer{}, s},
		leaderBalancer{kafkago.RoundRobinGroupBalancer{}, s},
	}
}
