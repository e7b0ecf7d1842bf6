package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/consumer"
)

// pump moves the records f fetches into l's buffer, waiting while it is
// full, and moves l's position past the records f dropped. The next fetch
// is sent while the records of the last one are buffered.
func (s *Source) pump(ctx context.Context, l *lane, f *fetcher) {
	ctx, cancel := context.WithCancel(ctx)
	results := make(chan fetchResult, 1)
	fetching := make(chan struct{})
	go func() {
		defer close(fetching)
		s.fetchLoop(ctx, l, f, results)
	}()
	defer func() {
		cancel()
		<-fetching
	}()
	for {
		var res fetchResult
		select {
		case <-ctx.Done():
			return
		case res = <-results:
		}
		if !s.buffer(ctx, l, res.records, res.from) {
			return
		}
		s.mu.Lock()
		if l.state != laneActive {
			s.mu.Unlock()
			return
		}
		target, write := l.skipTo(res.next, s.sched.Lane(l.name), s.store != nil)
		s.mu.Unlock()
		if write {
			s.storeSkipped(ctx, l, target)
		}
	}
}

// fetchLoop fetches with f until ctx is done and sends the results, in
// order, to results. Failures are logged and retried with a growing delay.
func (s *Source) fetchLoop(ctx context.Context, l *lane, f *fetcher, results chan<- fetchResult) {
	for failures := 0; ; {
		res, err := f.fetch(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			s.log.Warn("kafka: fetch", "group", s.cfg.Group, "lane", l.name, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(min(100*time.Millisecond<<min(failures-1, 5), 2*time.Second)):
			}
			continue
		}
		failures = 0
		select {
		case <-ctx.Done():
			return
		case results <- res:
		}
	}
}

// buffer hands recs to the scheduler as l's, waiting while l holds
// PartitionBuffer undelivered records; false when the lane was stopped
// (revoked, fenced) or ctx is done. from is the offset recs were fetched
// from: the lane's origin, if it has none yet, set before any record of
// the lane can be handed out and its offset committed.
func (s *Source) buffer(ctx context.Context, l *lane, recs []fetchedRecord, from int64) bool {
	ds := make([]*consumer.Message, len(recs))
	for i := range recs {
		ds[i] = &newDelivery(l, &recs[i], s.cfg.IDHeader).msg
	}
	for len(ds) > 0 {
		n, err := s.sched.Reserve(ctx, l.name, len(ds))
		if err != nil {
			return false
		}
		n = min(n, len(ds))
		s.mu.Lock()
		ok := l.state == laneActive
		if ok {
			if l.origin < 0 {
				l.origin = from
			}
			for _, m := range ds[:n] {
				m.Attempt = s.firstAttempt(l, offsetOf(m))
			}
			ok = s.sched.Add(l.name, ds[:n]...)
		}
		s.mu.Unlock()
		s.sched.Unreserve(l.name, n)
		if !ok {
			return false
		}
		ds = ds[n:]
	}
	return true
}

// storeSkipped writes next, a commit point past records the fetcher
// dropped, to the offsets table in a transaction of its own, fenced by the
// generation like BeforeCommit. A failure is logged; the next fetch tries
// again.
func (s *Source) storeSkipped(ctx context.Context, l *lane, next int64) {
	tp := topicPartition{l.topic, l.partition}
	s.mu.Lock()
	known := l.known()
	s.mu.Unlock()
	err := func() error {
		tx, err := s.store.db.Begin(ctx)
		if err != nil {
			return fmt.Errorf("kafka: store offset: %w", err)
		}
		defer func() { _ = tx.Rollback(context.Background()) }()
		if err := s.store.write(ctx, tx, tp, l.gen.id, position{next: next, high: next}, known); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err == nil:
		l.stored(next)
	case errors.Is(err, consumer.ErrFenced):
		l.fenced = true
		s.sched.Stop(l.name)
		s.fenced(l, err)
	case ctx.Err() == nil:
		s.log.Warn("kafka: storing the offset after dropped records", "group", s.cfg.Group, "lane", l.name, "offset", next, "err", err)
	}
}
