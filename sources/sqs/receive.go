package sqs

import (
	"context"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// systemAttributes are the attributes every receive asks for.
var systemAttributes = []types.MessageSystemAttributeName{
	types.MessageSystemAttributeNameApproximateReceiveCount,
	types.MessageSystemAttributeNameSentTimestamp,
	types.MessageSystemAttributeNameMessageGroupId,
	types.MessageSystemAttributeNameMessageDeduplicationId,
	types.MessageSystemAttributeNameSequenceNumber,
}

// receive is receiver i's loop: long-poll while the receiver holds fewer
// than BufferSize unfetched messages, and file what arrives under its lane.
func (s *Source) receive(i int) {
	defer s.recvWG.Done()
	ctx := s.recvCtx
	laneName := "receiver/" + strconv.Itoa(i)
	backoff := time.Duration(0)
	// A standard queue's receiver fills its own lane; a FIFO queue's fill
	// the groups, bounded together.
	reserveLane := laneName
	if s.fifo {
		reserveLane = ""
	}
	for ctx.Err() == nil {
		room, err := s.lanes.Reserve(ctx, reserveLane, s.cfg.MaxMessages)
		if err != nil {
			return // closed, or ctx is done
		}
		sent := time.Now()
		out, err := s.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(s.url),
			MaxNumberOfMessages:         int32(room),
			WaitTimeSeconds:             int32(s.cfg.WaitTime / time.Second),
			VisibilityTimeout:           int32(s.cfg.VisibilityTimeout / time.Second),
			MessageSystemAttributeNames: systemAttributes,
			MessageAttributeNames:       []string{"All"},
		})
		if err != nil {
			s.lanes.Unreserve(reserveLane, room)
			if ctx.Err() != nil {
				return
			}
			s.stats.receiveErrors.Add(1)
			backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
			s.log.Warn("sqs: receive failed; retrying", "queue", s.url, "receiver", i, "in", backoff, "err", err)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
			}
			continue
		}
		backoff = 0
		if len(out.Messages) == 0 {
			s.lanes.Unreserve(reserveLane, room)
			continue
		}
		entries := make([]*entry, len(out.Messages))
		for j, m := range out.Messages {
			e := s.convert(m, i)
			e.renewed.Store(sent.UnixNano())
			entries[j] = e
			if e.unreadable != nil {
				s.log.Warn("sqs: unreadable message; it has no dedupe ID and will be parked", "queue", s.url, "message_id", e.info.MessageID, "err", e.unreadable)
			}
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			s.lanes.Unreserve(reserveLane, room)
			// Closed while this receive was on its way: hand them back now.
			changes := make([]visibilityChange, len(entries))
			for j, e := range entries {
				changes[j] = visibilityChange{e: e}
			}
			ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
			if s.changeVisibility(ctx, changes) == nil {
				s.stats.released.Add(int64(len(changes)))
			}
			cancel()
			return
		}
		s.stats.received.Add(int64(len(entries)))
		for _, e := range entries {
			name := laneName
			if s.fifo {
				name = "group/" + e.info.GroupID
			}
			e.msg.Lane = name
			s.held[e] = struct{}{}
			s.lanes.Add(name, e.msg)
		}
		s.mu.Unlock()
		s.lanes.Unreserve(reserveLane, room)
	}
}
