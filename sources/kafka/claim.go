package kafka

import (
	"context"
	"errors"
	"slices"
	"time"
)

// Claim retries: a partition whose offsets row is locked by a transaction
// in progress is claimed again after claimRetryMin, doubling up to
// claimRetryMax, until that transaction ended.
const (
	claimRetryMin = 50 * time.Millisecond
	claimRetryMax = time.Second
)

// claimPartitions claims tps for generation gen in Postgres and hands the
// claimed ones to start, at once for the partitions that are free and
// later for those whose row another transaction holds locked (a batch of
// an earlier owner that has not committed yet, perhaps of a frozen
// process), until all are claimed or ctx is done. Partitions owned by a
// newer generation are logged and left alone. Without the offsets table
// every partition starts at once.
func (s *Source) claimPartitions(ctx context.Context, gen int32, tps []topicPartition, start func([]topicPartition, map[topicPartition]position)) {
	if s.store == nil {
		start(tps, nil)
		return
	}
	pending := tps
	wait := claimRetryMin
	failures := 0
	var waitingSince, warned time.Time
	for len(pending) > 0 {
		claimed, busy, err := s.store.claim(ctx, gen, pending)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errClaimBusy):
			busy = pending
		case err != nil:
			s.log.Error("kafka: claiming partitions", "group", s.cfg.Group, "generation", gen, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(min(time.Second<<min(failures, 5), 30*time.Second)):
			}
			failures++
			continue
		}
		failures = 0
		var got []topicPartition
		for _, tp := range pending {
			if _, ok := claimed[tp]; ok {
				got = append(got, tp)
			} else if !slices.Contains(busy, tp) {
				s.log.Error("kafka: partition is owned by a newer generation in Postgres; not consuming it in this generation "+
					"(if the group was deleted and recreated, delete its rows from the offsets table)",
					"group", s.cfg.Group, "lane", laneName(tp.topic, tp.partition), "generation", gen)
			}
		}
		start(got, claimed)
		if len(busy) > 0 && (waitingSince.IsZero() || time.Since(warned) >= time.Minute) {
			if waitingSince.IsZero() {
				waitingSince = time.Now()
			}
			warned = time.Now()
			s.log.Warn("kafka: offsets rows locked by a transaction of an earlier owner; consuming the other partitions, and these once it ends",
				"group", s.cfg.Group, "generation", gen, "lanes", laneNames(busy), "waited", time.Since(waitingSince).Round(time.Millisecond))
		} else if len(got) > 0 && !waitingSince.IsZero() {
			s.log.Info("kafka: locked partitions claimed", "group", s.cfg.Group, "generation", gen,
				"lanes", laneNames(got), "waited", time.Since(waitingSince).Round(time.Millisecond))
		}
		pending = busy
		if len(pending) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(wait*2, claimRetryMax)
	}
}

func laneNames(tps []topicPartition) []string {
	out := make([]string, len(tps))
	for i, tp := range tps {
		out[i] = laneName(tp.topic, tp.partition)
	}
	return out
}
