package sqs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// maxParallelCalls bounds the batch calls one Settle or heartbeat makes at once.
const maxParallelCalls = 8

// deleteAttempts is how often a failed entry of DeleteMessageBatch is tried.
const deleteAttempts = 3

// heartbeat renews the visibility of every held message (received and not
// yet settled) at most HeartbeatInterval after it was received or last
// renewed. Each lane's messages are renewed by calls of their own, which
// the heartbeat does not wait for: a slow call delays only the messages in
// it, which are skipped until it ends.
func (s *Source) heartbeat() {
	defer s.hbWG.Done()
	tick := time.NewTicker(s.cfg.HeartbeatInterval / 2)
	defer tick.Stop()
	sem := make(chan struct{}, maxParallelCalls)
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-tick.C:
		}
		// Renewing those older than half an interval, every half interval,
		// renews each message at most one interval after the last time.
		due := time.Now().Add(-s.cfg.HeartbeatInterval / 2).UnixNano()
		s.mu.Lock()
		byLane := map[string][]*entry{}
		for e := range s.held {
			if e.renewed.Load() <= due && e.startRenewal() {
				byLane[e.msg.Lane] = append(byLane[e.msg.Lane], e)
			}
		}
		s.mu.Unlock()
		for _, entries := range byLane {
			for _, chunk := range chunks(entries, maxPerReceive) {
				s.hbWG.Add(1)
				go func() {
					defer s.hbWG.Done()
					defer endRenewal(chunk)
					select {
					case sem <- struct{}{}:
					case <-s.ctx.Done():
						return
					}
					defer func() { <-sem }()
					ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HeartbeatInterval)
					defer cancel()
					s.renew(ctx, chunk)
				}()
			}
		}
	}
}

// startRenewal marks e as being renewed, unless it is settled or a renewal
// of it is in flight already.
func (e *entry) startRenewal() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.settled || e.renewing != nil {
		return false
	}
	e.renewing = make(chan struct{})
	return true
}

// endRenewal marks the renewals of entries as over.
func endRenewal(entries []*entry) {
	for _, e := range entries {
		e.mu.Lock()
		close(e.renewing)
		e.renewing = nil
		e.mu.Unlock()
	}
}

// renew extends the visibility of entries (one lane's, being renewed) to
// VisibilityTimeout from now, skipping any settled meanwhile.
func (s *Source) renew(ctx context.Context, entries []*entry) {
	timeout := int32(s.cfg.VisibilityTimeout / time.Second)
	var live []*entry
	for _, e := range entries {
		if !e.isSettled() {
			live = append(live, e)
		}
	}
	if len(live) == 0 {
		return
	}
	sent := time.Now()
	req := &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(s.url)}
	for j, e := range live {
		req.Entries = append(req.Entries, types.ChangeMessageVisibilityBatchRequestEntry{
			Id: aws.String(strconv.Itoa(j)), ReceiptHandle: aws.String(e.receipt), VisibilityTimeout: timeout,
		})
	}
	out, err := s.client.ChangeMessageVisibilityBatch(ctx, req)
	if err != nil {
		s.stats.heartbeatErrors.Add(int64(len(live)))
		if s.ctx.Err() == nil {
			s.log.Warn("sqs: visibility heartbeat failed; messages may be redelivered to another worker", "queue", s.url, "lane", live[0].msg.Lane, "messages", len(live), "err", err)
		}
		return
	}
	failed := map[int]bool{}
	for _, f := range out.Failed {
		j, _ := strconv.Atoi(aws.ToString(f.Id))
		if j < 0 || j >= len(live) {
			continue
		}
		failed[j] = true
		if live[j].isSettled() {
			continue // deleted or handed back meanwhile
		}
		s.stats.heartbeatErrors.Add(1)
		s.log.Warn("sqs: visibility heartbeat failed for a message", "queue", s.url, "message_id", live[j].info.MessageID,
			"code", aws.ToString(f.Code), "err", aws.ToString(f.Message))
	}
	s.stats.renewed.Add(int64(len(live) - len(failed)))
	for j, e := range live {
		if !failed[j] {
			e.renewed.Store(sent.UnixNano())
		}
	}
}

// visibilityChange sets one delivery's visibility timeout.
type visibilityChange struct {
	e       *entry
	timeout time.Duration
}

// visibilitySeconds rounds d up to whole seconds within what SQS accepts.
func visibilitySeconds(d time.Duration) int32 {
	secs := (d + time.Second - 1) / time.Second
	return int32(min(max(secs, 0), maxVisibility/time.Second))
}

// changeVisibility applies changes, ten at a time.
func (s *Source) changeVisibility(ctx context.Context, changes []visibilityChange) error {
	var mu sync.Mutex
	var errs []error
	parallel(chunks(changes, maxPerReceive), func(chunk []visibilityChange) {
		req := &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(s.url)}
		for j, c := range chunk {
			req.Entries = append(req.Entries, types.ChangeMessageVisibilityBatchRequestEntry{
				Id: aws.String(strconv.Itoa(j)), ReceiptHandle: aws.String(c.e.receipt), VisibilityTimeout: visibilitySeconds(c.timeout),
			})
		}
		out, err := s.client.ChangeMessageVisibilityBatch(ctx, req)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
			return
		}
		for _, f := range out.Failed {
			j, _ := strconv.Atoi(aws.ToString(f.Id))
			errs = append(errs, fmt.Errorf("message %s: %s: %s", chunk[j].e.info.MessageID, aws.ToString(f.Code), aws.ToString(f.Message)))
		}
	})
	if len(errs) > 0 {
		s.log.Warn("sqs: visibility change failed; the messages reappear when their visibility timeout runs out", "queue", s.url, "err", errors.Join(errs...))
	}
	return errors.Join(errs...)
}

// DeleteError reports acknowledged messages that could not be deleted after
// retries. Their effects are committed: when SQS delivers them again, the
// consumer recognises them as duplicates and they are deleted then.
type DeleteError struct {
	Failed []DeleteFailure
}

// DeleteFailure is one message DeleteMessageBatch did not delete.
type DeleteFailure struct {
	MessageID string
	Code      string
	Message   string
}

func (e *DeleteError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sqs: %d acknowledged messages not deleted (they will be redelivered and recognised as duplicates):", len(e.Failed))
	for i, f := range e.Failed {
		if i == 5 {
			fmt.Fprintf(&b, " and %d more", len(e.Failed)-i)
			break
		}
		fmt.Fprintf(&b, " %s (%s: %s);", f.MessageID, f.Code, f.Message)
	}
	return b.String()
}

// deleteMessages deletes entries with DeleteMessageBatch, ten at a time,
// retrying entries that failed for a reason that is not the sender's fault.
func (s *Source) deleteMessages(ctx context.Context, entries []*entry) error {
	var mu sync.Mutex
	var failed []DeleteFailure
	parallel(chunks(entries, maxPerReceive), func(chunk []*entry) {
		lost := s.deleteChunk(ctx, chunk)
		mu.Lock()
		failed = append(failed, lost...)
		mu.Unlock()
	})
	s.stats.deleted.Add(int64(len(entries) - len(failed)))
	if len(failed) == 0 {
		return nil
	}
	s.stats.deleteErrors.Add(int64(len(failed)))
	err := &DeleteError{Failed: failed}
	s.log.Warn("sqs: delete failed", "queue", s.url, "err", err)
	return err
}

func (s *Source) deleteChunk(ctx context.Context, chunk []*entry) []DeleteFailure {
	var lost []DeleteFailure
	for attempt := 1; len(chunk) > 0; attempt++ {
		req := &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(s.url)}
		for j, e := range chunk {
			req.Entries = append(req.Entries, types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(j)), ReceiptHandle: aws.String(e.receipt)})
		}
		out, err := s.client.DeleteMessageBatch(ctx, req)
		var again []*entry
		if err != nil {
			// The SDK already retried transient errors.
			for _, e := range chunk {
				lost = append(lost, DeleteFailure{MessageID: e.info.MessageID, Code: "RequestFailed", Message: err.Error()})
			}
			return lost
		}
		for _, f := range out.Failed {
			j, _ := strconv.Atoi(aws.ToString(f.Id))
			if j < 0 || j >= len(chunk) {
				continue
			}
			if !f.SenderFault && attempt < deleteAttempts && ctx.Err() == nil {
				again = append(again, chunk[j])
				continue
			}
			lost = append(lost, DeleteFailure{MessageID: chunk[j].info.MessageID, Code: aws.ToString(f.Code), Message: aws.ToString(f.Message)})
		}
		if len(again) > 0 {
			s.stats.deleteRetries.Add(int64(len(again)))
			select {
			case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
			case <-ctx.Done():
			}
		}
		chunk = again
	}
	return lost
}

func chunks[T any](xs []T, n int) [][]T {
	var out [][]T
	for len(xs) > n {
		out = append(out, xs[:n])
		xs = xs[n:]
	}
	if len(xs) > 0 {
		out = append(out, xs)
	}
	return out
}

// parallel runs f on every chunk, at most maxParallelCalls at once.
func parallel[T any](cs [][]T, f func([]T)) {
	if len(cs) == 1 {
		f(cs[0])
		return
	}
	sem := make(chan struct{}, maxParallelCalls)
	var wg sync.WaitGroup
	for _, c := range cs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			f(c)
		}()
	}
	wg.Wait()
}
