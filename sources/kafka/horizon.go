package kafka

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"
)

// horizonTimeout bounds each DescribeConfigs call behind RedeliveryHorizon.
const horizonTimeout = 10 * time.Second

// horizonCache keeps the retention the brokers reported. Only an answer is
// kept: after a failure the next call asks the brokers again.
type horizonCache struct {
	mu    sync.Mutex
	known bool
	d     time.Duration
}

// RedeliveryHorizon returns the longest retention.ms of the configured topics: a
// record can be delivered again (after an offset reset, or to a new group)
// for as long as the broker keeps it. Topics that keep records forever
// (retention.ms = -1) give math.MaxInt64. The first answer is kept; a
// failure (the brokers cannot be reached, a topic is missing) is returned
// and not kept, so a later call asks again.
// It implements consumer.HorizonSource.
func (s *Source) RedeliveryHorizon(ctx context.Context) (time.Duration, error) {
	s.horizon.mu.Lock()
	defer s.horizon.mu.Unlock()
	if s.horizon.known {
		return s.horizon.d, nil
	}
	ctx, cancel := context.WithTimeout(ctx, horizonTimeout)
	defer cancel()
	d, err := s.retention(ctx)
	if err != nil {
		return 0, fmt.Errorf("kafka: read the retention of topics %v: %w", s.cfg.Topics, err)
	}
	s.horizon.known, s.horizon.d = true, d
	return d, nil
}

func (s *Source) retention(ctx context.Context) (time.Duration, error) {
	client := &kafkago.Client{
		Addr:      kafkago.TCP(s.cfg.Brokers...),
		Timeout:   horizonTimeout,
		Transport: &kafkago.Transport{TLS: s.cfg.TLS, SASL: s.cfg.SASL, ClientID: s.cfg.ClientID, DialTimeout: s.cfg.DialTimeout},
	}
	if t, ok := client.Transport.(*kafkago.Transport); ok {
		defer t.CloseIdleConnections()
	}
	req := &kafkago.DescribeConfigsRequest{}
	for _, t := range s.cfg.Topics {
		req.Resources = append(req.Resources, kafkago.DescribeConfigRequestResource{
			ResourceType: kafkago.ResourceTypeTopic, ResourceName: t, ConfigNames: []string{"retention.ms"},
		})
	}
	resp, err := client.DescribeConfigs(ctx, req)
	if err != nil {
		return 0, err
	}
	var longest time.Duration
	for _, r := range resp.Resources {
		if r.Error != nil {
			return 0, fmt.Errorf("topic %s: %w", r.ResourceName, r.Error)
		}
		for _, e := range r.ConfigEntries {
			if e.ConfigName != "retention.ms" {
				continue
			}
			ms, err := strconv.ParseInt(e.ConfigValue, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("topic %s: retention.ms %q: %w", r.ResourceName, e.ConfigValue, err)
			}
			if ms < 0 || ms > math.MaxInt64/int64(time.Millisecond) {
				return math.MaxInt64, nil
			}
			longest = max(longest, time.Duration(ms)*time.Millisecond)
		}
	}
	return longest, nil
}
