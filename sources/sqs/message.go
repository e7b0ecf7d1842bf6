package sqs

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/effectively-once/effectively/consumer"
	"github.com/effectively-once/effectively/dedupe"
)

// SourceName is Message.Source for messages of this package.
const SourceName = "sqs"

// ErrUnreadable is matched by every *UnreadableError.
var ErrUnreadable = errors.New("sqs: unreadable message")

// UnreadableError reports a message the source could not turn into a
// consumer message with a dedupe ID: an SNS envelope that is not JSON, or a
// missing required ID attribute. Such a message is delivered with an empty
// Message.ID; the key function ParkUnreadable returns reports this error
// for it, so the consumer parks it with the reason instead of retrying it.
type UnreadableError struct {
	MessageID string
	Reason    string
}

func (e *UnreadableError) Error() string {
	return fmt.Sprintf("sqs: unreadable message %s: %s", e.MessageID, e.Reason)
}

// Is makes errors.Is(err, ErrUnreadable) true.
func (e *UnreadableError) Is(target error) bool { return target == ErrUnreadable }

// ParkUnreadable returns a consumer.KeyFunc that parks messages this
// package could not read (see UnreadableError) with the reason, and derives
// every other message's key with next (consumer.DefaultKey when nil). Set
// it as the consumer's KeyFunc:
//
//	consumer.Config{KeyFunc: sqs.ParkUnreadable(nil), ...}
//
// Without it an unreadable message still has an empty ID, which the dedupe
// strategy refuses, so it is parked all the same, with a vaguer reason.
func ParkUnreadable(next consumer.KeyFunc) consumer.KeyFunc {
	if next == nil {
		next = consumer.DefaultKey
	}
	return func(m *consumer.Message) (dedupe.Key, error) {
		if err := Unreadable(m); err != nil {
			return dedupe.Key{}, err
		}
		return next(m)
	}
}

// Unreadable returns the *UnreadableError of a message this package could
// not read, or nil.
func Unreadable(m *consumer.Message) error {
	if e, ok := m.SourceData.(*entry); ok && e.unreadable != nil {
		return e.unreadable
	}
	return nil
}

// Info is what SQS said about one delivery of a message.
type Info struct {
	// MessageID is the SQS MessageId (also Message.Ref).
	MessageID string
	// ReceiveCount is ApproximateReceiveCount (also Message.Attempt).
	ReceiveCount int
	// GroupID and DeduplicationID are set on FIFO queues.
	GroupID, DeduplicationID string
	// SequenceNumber is the FIFO sequence number.
	SequenceNumber string
	// SNSMessageID and TopicARN are set for unwrapped SNS notifications.
	SNSMessageID, TopicARN string
}

// MessageInfo returns what SQS said about m, if m came from a Source of this
// package.
func MessageInfo(m *consumer.Message) (Info, bool) {
	e, ok := m.SourceData.(*entry)
	if !ok {
		return Info{}, false
	}
	return e.info, true
}

// entry is the source's state for one delivery of one message. It is the
// consumer.Message's SourceData.
type entry struct {
	msg     *consumer.Message
	receipt string
	info    Info
	recv    int // index of the receiver that received it

	unreadable *UnreadableError

	// mu guards settled and renewing; it is never held across a call to
	// SQS. Settle waits for a renewal in flight (renewing) before it hands
	// a message back, so that its visibility change comes after the
	// renewal.
	mu       sync.Mutex
	settled  bool
	renewing chan struct{} // closed when the renewal in flight ends; nil when none
	// renewed is when the visibility was last set (receive or renewal),
	// in Unix nanoseconds, taken before the request was sent.
	renewed atomic.Int64
}

// snsEnvelope is the JSON body SNS delivers to SQS without raw delivery.
type snsEnvelope struct {
	Type              string
	MessageId         string
	TopicArn          string
	Message           *string
	Timestamp         string
	MessageAttributes map[string]struct {
		Type  string
		Value string
	}
}

// convert turns a received SQS message into the consumer's message.
func (s *Source) convert(m types.Message, recv int) *entry {
	e := &entry{receipt: aws.ToString(m.ReceiptHandle), recv: recv}
	attr := m.Attributes
	e.info = Info{
		MessageID:       aws.ToString(m.MessageId),
		GroupID:         attr[string(types.MessageSystemAttributeNameMessageGroupId)],
		DeduplicationID: attr[string(types.MessageSystemAttributeNameMessageDeduplicationId)],
		SequenceNumber:  attr[string(types.MessageSystemAttributeNameSequenceNumber)],
	}
	e.info.ReceiveCount, _ = strconv.Atoi(attr[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
	if e.info.ReceiveCount < 1 {
		e.info.ReceiveCount = 1
	}
	cm := &consumer.Message{
		Value:      []byte(aws.ToString(m.Body)),
		Source:     SourceName,
		Ref:        e.info.MessageID,
		Attempt:    e.info.ReceiveCount,
		SourceData: e,
	}
	if ms, err := strconv.ParseInt(attr[string(types.MessageSystemAttributeNameSentTimestamp)], 10, 64); err == nil {
		cm.Time = time.UnixMilli(ms)
	}
	if s.fifo && e.info.GroupID != "" {
		cm.Key = []byte(e.info.GroupID)
	}
	for name, v := range m.MessageAttributes {
		cm.Headers = append(cm.Headers, consumer.Header{Key: name, Value: attributeBytes(v)})
	}
	sortHeaders(cm.Headers)
	e.msg = cm

	if s.cfg.SNSEnvelope {
		if err := unwrapSNS(e); err != nil {
			e.unreadable = &UnreadableError{MessageID: e.info.MessageID, Reason: err.Error()}
			return e
		}
	}
	switch {
	case s.fifo:
		cm.ID = e.info.DeduplicationID
		if cm.ID == "" {
			e.unreadable = &UnreadableError{MessageID: e.info.MessageID, Reason: "FIFO message has no MessageDeduplicationId"}
		}
	default:
		if v, ok := cm.Header(s.cfg.IDAttribute); ok && len(v) > 0 {
			cm.ID = string(v)
		} else if s.cfg.RequireIDAttribute {
			e.unreadable = &UnreadableError{MessageID: e.info.MessageID, Reason: fmt.Sprintf("no %q message attribute", s.cfg.IDAttribute)}
		} else if e.info.SNSMessageID != "" {
			cm.ID = e.info.SNSMessageID
		} else {
			cm.ID = e.info.MessageID
		}
	}
	return e
}

// unwrapSNS replaces the message's value with the notification inside its
// SNS envelope and adds the notification's attributes to its headers.
func unwrapSNS(e *entry) error {
	var env snsEnvelope
	if err := json.Unmarshal(e.msg.Value, &env); err != nil {
		return fmt.Errorf("body is not an SNS envelope: not JSON: %v", err)
	}
	if env.MessageId == "" || env.Message == nil {
		return errors.New("body is not an SNS envelope: it lacks MessageId or Message (is raw message delivery on?)")
	}
	e.info.SNSMessageID = env.MessageId
	e.info.TopicARN = env.TopicArn
	e.msg.Value = []byte(*env.Message)
	if t, err := time.Parse(time.RFC3339Nano, env.Timestamp); err == nil {
		e.msg.Time = t
	}
	var hs []consumer.Header
	for name, v := range env.MessageAttributes {
		hs = append(hs, consumer.Header{Key: name, Value: []byte(v.Value)})
	}
	sortHeaders(hs)
	// The notification's own attributes come first, so Header finds them
	// before an SQS attribute of the same name.
	e.msg.Headers = append(hs, e.msg.Headers...)
	return nil
}

func attributeBytes(v types.MessageAttributeValue) []byte {
	if v.StringValue != nil {
		return []byte(*v.StringValue)
	}
	return v.BinaryValue
}

func sortHeaders(hs []consumer.Header) {
	slices.SortFunc(hs, func(a, b consumer.Header) int { return strings.Compare(a.Key, b.Key) })
}
