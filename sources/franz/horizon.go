package franz

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
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

// RedeliveryHorizon returns the longest retention.ms of the configured
// topics: a record can be delivered again (after an offset reset, or to a
// new group) for as long as the broker keeps it. Topics that keep records
// forever (retention.ms = -1) give math.MaxInt64. The first answer is
// kept; a failure is returned and not kept, so a later call asks again.
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
		return 0, fmt.Errorf("franz: read the retention of topics %v: %w", s.cfg.Topics, err)
	}
	s.horizon.known, s.horizon.d = true, d
	return d, nil
}

func (s *Source) retention(ctx context.Context) (time.Duration, error) {
	// A client of its own, without the group: the source's joins the
	// group on the first Fetch, which may come later.
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(s.cfg.Brokers...)}, s.cfg.Opts...)...)
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	req := kmsg.NewPtrDescribeConfigsRequest()
	for _, t := range s.cfg.Topics {
		r := kmsg.NewDescribeConfigsRequestResource()
		r.ResourceType = kmsg.ConfigResourceTypeTopic
		r.ResourceName = t
		r.ConfigNames = []string{"retention.ms"}
		req.Resources = append(req.Resources, r)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, err
	}
	var longest time.Duration
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return 0, fmt.Errorf("topic %s: %w", r.ResourceName, err)
		}
		for _, e := range r.Configs {
			if e.Name != "retention.ms" || e.Value == nil {
				continue
			}
			ms, err := strconv.ParseInt(*e.Value, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("topic %s: retention.ms %q: %w", r.ResourceName, *e.Value, err)
			}
			if ms < 0 || ms > math.MaxInt64/int64(time.Millisecond) {
				return math.MaxInt64, nil
			}
			longest = max(longest, time.Duration(ms)*time.Millisecond)
		}
	}
	return longest, nil
}
