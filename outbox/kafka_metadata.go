package outbox

import (
	"context"
	"errors"
	"fmt"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
)

// How KafkaSink learns its topic's partitions, and how it tells a topic
// that does not exist from one its Transport's cache does not know yet.
//
// kafka-go's Transport answers metadata requests from a cache it refreshes
// every MetadataTTL (6 s by default, up to whatever the user set), and
// routes produce requests by the same cache. A topic created after the
// cache was filled is "unknown" to it until the next refresh, though the
// broker knows it. So an unknown topic is never taken from the cache: the
// sink asks the broker through a Transport of its own, made for that one
// request, and only a topic that answer does not list is refused for good.
// When the broker does list it, the sink resets the Writer's Transport
// (CloseIdleConnections, kafka-go's way to drop its cached state: the next
// request reads the metadata afresh) and tries again.

// partitions returns how many partitions the topic has, from the
// Transport's metadata (which caches it).
func (s *KafkaSink) partitions(ctx context.Context) (int, error) {
	n, err := s.metadata(ctx, s.transport())
	if err != nil {
		return 0, fmt.Errorf("outbox: metadata of %s: %w", s.topic, err)
	}
	return n, nil
}

// transport is the RoundTripper the sink's requests go through.
func (s *KafkaSink) transport() kafkago.RoundTripper {
	if s.client.Transport != nil {
		return s.client.Transport
	}
	return kafkago.DefaultTransport
}

// metadata asks rt for the topic's partitions.
func (s *KafkaSink) metadata(ctx context.Context, rt kafkago.RoundTripper) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, s.readTimeout)
	defer cancel()
	r, err := rt.RoundTrip(ctx, s.client.Addr, &metadataAPI.Request{TopicNames: []string{s.topic}, AllowAutoTopicCreation: s.autoCreate})
	if err != nil {
		return 0, err
	}
	for _, t := range r.(*metadataAPI.Response).Topics {
		if t.Name == s.topic {
			if t.ErrorCode != 0 {
				return 0, kafkago.Error(t.ErrorCode)
			}
			if len(t.Partitions) == 0 {
				return 0, kafkago.LeaderNotAvailable
			}
			return len(t.Partitions), nil
		}
	}
	return 0, kafkago.UnknownTopicOrPartition
}

// unknownTopic reports whether err says the topic is unknown: the broker's
// UNKNOWN_TOPIC_OR_PARTITION, or the Transport finding no route to it in
// its cached metadata.
func unknownTopic(err error) bool {
	return errors.Is(err, kafkago.UnknownTopicOrPartition) || errors.Is(err, protocol.ErrNoTopic)
}

// recheckTopic is called after a request found the topic unknown (cause),
// having read metaGen as gen before sending it. It asks the broker for the
// topic's metadata on a connection of its own, not through the Transport's
// cache:
//
//   - the topic is not listed: it returns cause's refusal for good
//     (Permanent), saying the broker was asked;
//   - it is listed: it resets the Writer's Transport, so that its next
//     request reads fresh metadata, and returns nil (try again);
//   - the broker could not be asked: it returns a transient error.
//
// Concurrent callers (a Publish's partitions) check one at a time, and a
// caller whose request went out before another's reset only tries again.
func (s *KafkaSink) recheckTopic(ctx context.Context, gen uint64, cause error) error {
	s.metaMu.Lock()
	defer s.metaMu.Unlock()
	if s.metaGen.Load() != gen {
		return nil // reset since that request: try again with the fresh cache
	}
	rt := s.transport()
	t, ok := rt.(*kafkago.Transport)
	if ok {
		fresh := &kafkago.Transport{
			Dial: t.Dial, DialTimeout: t.DialTimeout, ClientID: t.ClientID, TLS: t.TLS, SASL: t.SASL,
			Resolver: t.Resolver, Context: t.Context, MetadataTopics: []string{s.topic},
		}
		defer fresh.CloseIdleConnections()
		rt = fresh
	} // else a RoundTripper of the user's own: asked as it is
	_, err := s.metadata(ctx, rt)
	switch {
	case err == nil:
		if ok {
			t.CloseIdleConnections()
		}
		s.metaGen.Add(1)
		if s.logger != nil {
			s.logger.Printf("outbox: topic %s was unknown to the Writer's Transport (%v), but the broker lists it: "+
				"the Transport's cached metadata is reset and the messages are sent again", s.topic, cause)
		}
		return nil
	case errors.Is(err, kafkago.UnknownTopicOrPartition):
		return Permanent(fmt.Errorf("outbox: topic %s does not exist: the broker, asked afresh (not the Transport's cache), does not list it: %w",
			s.topic, kafkago.UnknownTopicOrPartition))
	default:
		return fmt.Errorf("outbox: topic %s was unknown (%v), and asking the broker afresh failed: %w", s.topic, cause, err)
	}
}
